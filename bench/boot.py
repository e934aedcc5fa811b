#!/usr/bin/env python3
"""Boot benchmark: whole-process time of several ways to start a no-op.

    python3 bench/boot.py --wisp target/release/wisp --out bench/results/boot.json

Every peer is launched by the same small C launcher (bench/tools/spawntime.c):
fork + execvp + waitpid, CLOCK_MONOTONIC taken just before fork() and just
after waitpid() returned. So each figure is "spawn until the process has been
reaped", and launcher overhead is identical for all peers.

Peers (see PEERS at the bottom; each is a small object, so more can be added,
e.g. a warm-start path served by a daemon):

  wisp               <wisp> run --stats noop         (unikernel VM, cold boot)
  forkexec           static no-op C program          (plain fork+exec)
  container_unshare  unshare -fpnmiu --mount-proc <noop>
  container_crun     crun run (OCI bundle with only the static no-op)
  linux_vm           qemu-system-x86_64 -accel tcg -M microvm, Debian cloud
                     kernel + busybox initramfs whose /init powers off

Python 3 standard library only; matplotlib is used for a plot if available.
"""

import argparse
import datetime
import glob
import json
import os
import platform
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
TOOLS = os.path.join(BENCH, "tools")
BUILD = os.path.join(BENCH, "build")

LINUX_MARKER = "WISP_BENCH_LINUX_BOOTED"
STATS_PREFIX = "wisp-stats:"


class Skip(Exception):
    """A peer cannot run on this machine; the message says why."""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# building helpers


def _stale(target, *sources):
    if not os.path.exists(target):
        return True
    t = os.path.getmtime(target)
    return any(os.path.getmtime(s) > t for s in sources)


def cc(src, out, static=False):
    if not _stale(out, src):
        return out
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise Skip("no C compiler (install gcc, libc6-dev: scripts/install-bench-deps.sh)")
    cmd = [compiler, "-O2", "-Wall"] + (["-static"] if static else []) + ["-o", out, src]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip("build failed: %s\n%s" % (" ".join(cmd), r.stderr.strip()))
    return out


def cpio_newc(entries):
    """entries: (name, mode, data_bytes, (rdev_major, rdev_minor)). Returns bytes."""
    out = bytearray()
    ino = 1
    for name, mode, data, rdev in entries + [("TRAILER!!!", 0, b"", (0, 0))]:
        ino += 1
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
        out += ("070701" + "".join("%08X" % f for f in fields)).encode()
        out += name.encode() + b"\0"
        out += b"\0" * (-len(out) % 4)
        out += data
        out += b"\0" * (-len(out) % 4)
    out += b"\0" * (-len(out) % 512)
    return bytes(out)


# --------------------------------------------------------------------------
# statistics


def percentile(sorted_vals, p):
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, -(-p * len(sorted_vals) // 100) - 1))
    return sorted_vals[int(k)]


def median(vals):
    s = sorted(vals)
    n = len(s)
    if n == 0:
        return None
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def summary(vals, nd=4):
    s = sorted(vals)
    if not s:
        return {}
    r = lambda v: round(v, nd)  # noqa: E731
    return {"median": r(median(s)), "min": r(s[0]), "max": r(s[-1]),
            "p99": r(percentile(s, 99)), "mean": r(sum(s) / len(s))}


# --------------------------------------------------------------------------
# the shared launcher


class Context:
    def __init__(self, args):
        self.args = args
        self.wisp = os.path.abspath(args.wisp)
        os.makedirs(BUILD, exist_ok=True)
        self._spawntime = None
        self._noop = None

    @property
    def spawntime(self):
        if not self._spawntime:
            self._spawntime = cc(os.path.join(TOOLS, "spawntime.c"), os.path.join(BUILD, "spawntime"))
        return self._spawntime

    @property
    def noop(self):
        if not self._noop:
            self._noop = cc(os.path.join(TOOLS, "noop.c"), os.path.join(BUILD, "noop"), static=True)
        return self._noop


class Run:
    """One measured run: times, status, and the child's captured output."""

    def __init__(self, spawn_ns, reap_ns, status, out_path, err_path):
        self.spawn_ns, self.reap_ns, self.status = spawn_ns, reap_ns, status
        self.out_path, self.err_path = out_path, err_path

    @property
    def ms(self):
        return (self.reap_ns - self.spawn_ns) / 1e6

    def read(self, which="err"):
        try:
            with open(self.err_path if which == "err" else self.out_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


def spawntime(ctx, argv, runs, warmup, timeout_s, wrapper=(), outdir=None):
    """Run argv `runs` times (after `warmup` unrecorded runs) under the launcher.

    wrapper: argv prefix that sets up an environment for the launcher itself
    (e.g. a private mount namespace); it runs once, outside the timed window.
    The child's stdout/stderr go to files in outdir (same cost for every peer).
    """
    cmd = list(wrapper) + [ctx.spawntime, "-n", str(runs), "-w", str(warmup),
                           "-t", str(timeout_s), "-d", outdir, "--"] + list(argv)
    backstop = (runs + warmup) * (timeout_s + 5) + 30
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=backstop)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.communicate()
        raise Skip("launcher timed out after %ds" % backstop)
    if p.returncode != 0:
        raise Skip("launcher failed (rc %d): %s" % (p.returncode, err.strip()[-500:]))
    result = []
    for i, line in enumerate(out.split("\n")):
        if not line.strip():
            continue
        a, b, c = line.split()
        result.append(Run(int(a), int(b), int(c), os.path.join(outdir, "%d.out" % i),
                          os.path.join(outdir, "%d.err" % i)))
    return result


# --------------------------------------------------------------------------
# peers


class Peer:
    """A way to start a no-op. Subclasses fill in check/prepare/argv.

    The default measure() runs argv() under the shared launcher. A peer with a
    different notion of "start" (e.g. a warm path: API request to a running
    daemon -> first console line) overrides measure() and returns a list of
    objects with .ms/.status, and may override analyse() for extra output.
    """

    name = "?"
    description = ""
    slow = False          # few runs (QEMU TCG)
    timeout_s = 30        # per run
    wrapper = ()          # environment for the launcher (outside timing)

    def check(self, ctx):
        """Raise Skip(reason) if this peer cannot run here."""

    def prepare(self, ctx):
        """Build whatever the peer needs (once, before measuring)."""

    def argv(self, ctx):
        raise NotImplementedError

    def cleanup(self, ctx):
        pass

    def command_str(self, ctx):
        try:
            pre = shlex.join(self.wrapper) + " " if self.wrapper else ""
            return pre + "spawntime -- " + shlex.join(self.argv(ctx))
        except Exception:  # noqa: BLE001
            return None

    def measure(self, ctx, runs, warmup, outdir):
        return spawntime(ctx, self.argv(ctx), runs, warmup, self.timeout_s, self.wrapper, outdir)

    def validate(self, ctx, runs):
        """Return (ok_runs, notes). Default: exit status 0."""
        bad = [r for r in runs if r.status != 0]
        notes = []
        if bad:
            notes.append("%d/%d runs exited non-zero (e.g. status %d: %s)" % (
                len(bad), len(runs), bad[0].status, bad[0].read("err").strip()[-300:]))
        return [r for r in runs if r.status == 0], notes

    def analyse(self, ctx, runs):
        """Extra per-peer results (dict) merged into the peer's JSON entry."""
        return {}


class WispCold(Peer):
    name = "wisp"
    description = "wisp run --stats noop: cold boot of a unikernel VM that exits 0 at once"
    timeout_s = 20

    def check(self, ctx):
        if not os.path.exists(ctx.wisp):
            raise Skip("wisp binary not found at %s (build it: cargo build --release)" % ctx.wisp)
        if not os.access(ctx.wisp, os.X_OK):
            raise Skip("%s is not executable" % ctx.wisp)

    def prepare(self, ctx):
        # A trial run: fail early and clearly instead of 200 times.
        try:
            r = subprocess.run(self.argv(ctx), capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise Skip("trial run of '%s' timed out after %ds" % (" ".join(self.argv(ctx)), self.timeout_s))
        if r.returncode != 0:
            raise Skip("trial run of '%s' exited %d: %s" % (
                " ".join(self.argv(ctx)), r.returncode, (r.stderr or r.stdout).strip()[-500:]))
        if parse_stats(r.stderr) is None:
            log("  note: trial run printed no '%s' line on stderr; no breakdown" % STATS_PREFIX)

    def argv(self, ctx):
        return [ctx.wisp, "run", "--stats", "noop"]

    def analyse(self, ctx, runs):
        return {"breakdown": wisp_breakdown(runs)}


class WispSyncTeardown(WispCold):
    """The same cold boot, but the VM is destroyed inside the wisp process
    before it exits (WISP_SYNC_TEARDOWN=1) instead of by a detached child:
    shows what KVM teardown costs on this host."""
    name = "wisp_sync_teardown"
    description = "wisp run --stats noop with WISP_SYNC_TEARDOWN=1 (VM destroyed before exit)"

    def prepare(self, ctx):
        os.environ["WISP_SYNC_TEARDOWN"] = "1"
        super().prepare(ctx)

    def cleanup(self, ctx):
        os.environ.pop("WISP_SYNC_TEARDOWN", None)


class ApiRun:
    """One API measurement (same interface as Run)."""

    def __init__(self, ns, status=0):
        self.ns, self.status = ns, status

    @property
    def ms(self):
        return self.ns / 1e6

    def read(self, which="err"):
        return ""


class WispWarm(Peer):
    """The toolstack's warm path: a running wispd with a pool of prepared
    shells; each run is POST /v1/vms?attach=true for `hello` until its first
    console line arrives at the client. Before each run the pool is allowed
    to refill, so every request takes a prepared shell (the execute phase
    only)."""
    name = "wisp_warm"
    description = "wispd API request -> guest's first console line (hello), shell from the pool"
    pool = 8
    prepared = True

    def wispd(self, ctx):
        return os.path.join(os.path.dirname(os.path.abspath(ctx.wisp)), "wispd")

    def check(self, ctx):
        if not os.path.exists(self.wispd(ctx)):
            raise Skip("wispd not found next to %s" % ctx.wisp)

    def command_str(self, ctx):
        return "POST /v1/vms?attach=true {\"image\": \"hello\"} (first line)"

    def measure(self, ctx, runs, warmup, outdir):
        sys.path.insert(0, BENCH)
        import wispapi
        pool = "16M=%d" % (self.pool if self.prepared else 0)
        d = wispapi.Daemon(self.wispd(ctx), os.path.join(ROOT, "build", "images"), pool=pool)
        try:
            api, ctl = d.api(), d.api()
            out = []
            for i in range(warmup + runs):
                if self.prepared:
                    d.wait_pool(ctl, self.pool)
                time.sleep(0.01)  # let the previous VM's teardown finish
                ns, vm = wispapi.boot_to_first_line(api, {"image": "hello"})
                ctl.call("DELETE", "/v1/vms/%s?force=true" % vm)
                if i >= warmup:
                    out.append(ApiRun(ns))
            return out
        finally:
            d.stop()


class WispApiCold(WispWarm):
    """The same request with an empty pool: prepare (VMM process, KVM VM,
    first entry) and execute on the request path."""
    name = "wisp_api_cold"
    description = "wispd API request -> first console line (hello), no prepared shell (prepare + execute)"
    prepared = False


def footprint(ctx, n=20):
    """Image sizes, and host memory of running `sleeper` VMs: each process's
    PSS, and MemAvailable drop per VM (includes KVM's kernel memory)."""
    out = {"images_bytes": {}}
    images = os.path.join(ROOT, "build", "images")
    for name in ("noop", "hello", "sleeper"):
        p = os.path.join(images, name)
        if os.path.exists(p):
            out["images_bytes"][name] = os.path.getsize(p)
    if not os.path.exists(ctx.wisp):
        return out

    def avail_kb():
        m = re.search(r"MemAvailable:\s*(\d+) kB", _read("/proc/meminfo"))
        return int(m.group(1))

    before = avail_kb()
    env = dict(os.environ, WISP_SOCKET="/nonexistent/wispd.sock")  # one VM per `wisp run` process
    procs = [subprocess.Popen([ctx.wisp, "run", "sleeper", "--", "30s"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env) for _ in range(n)]
    try:
        time.sleep(1.5)
        alive = [p for p in procs if p.poll() is None]
        after = avail_kb()
        pss = []
        for p in alive:
            m = re.search(r"^Pss:\s*(\d+) kB", _read("/proc/%d/smaps_rollup" % p.pid), re.M)
            if m:
                pss.append(int(m.group(1)))
        out["sleeper"] = {
            "vms": n,
            "alive": len(alive),
            "pss_kb_median": median(pss) if pss else None,
            "mem_available_drop_kb_per_vm": round((before - after) / max(1, len(alive)), 1),
            "note": "PSS = the monitor process's proportional share of its memory; the MemAvailable "
                    "drop also counts KVM's kernel memory and page tables",
        }
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    return out


def parse_stats(text):
    for line in text.splitlines():
        if line.startswith(STATS_PREFIX):
            try:
                return json.loads(line[len(STATS_PREFIX):].strip())
            except ValueError:
                return None
    return None


def wisp_breakdown(runs):
    """Split each run into process start, monitor phases, teardown (all µs)."""
    comps = {}
    exits = []
    order = ["process_start"]
    parsed = 0
    for r in runs:
        st = parse_stats(r.read("err"))
        if not st or "t_main_ns" not in st or "t_done_ns" not in st:
            continue
        parsed += 1
        row = {
            "process_start": (st["t_main_ns"] - r.spawn_ns) / 1e3,
            "monitor_total": (st["t_done_ns"] - st["t_main_ns"]) / 1e3,
            "process_teardown": (r.reap_ns - st["t_done_ns"]) / 1e3,
        }
        phases = st.get("phases_us") or {}
        for k, v in phases.items():
            row["phase." + k] = float(v)
            if "phase." + k not in order:
                order.append("phase." + k)
        row["monitor_other"] = row["monitor_total"] - sum(float(v) for v in phases.values())
        for k, v in row.items():
            comps.setdefault(k, []).append(v)
        if "exits" in st:
            exits.append(st["exits"])
    if not parsed:
        return {"available": False,
                "note": "no '%s {json}' line with t_main_ns/t_done_ns on wisp's stderr" % STATS_PREFIX}
    order += ["monitor_other", "monitor_total", "process_teardown"]
    return {
        "available": True,
        "runs_parsed": parsed,
        "unit": "us",
        "order": [k for k in order if k in comps],
        "components_us": {k: summary(comps[k], 1) for k in order if k in comps},
        "exits": summary(exits, 1) if exits else None,
        "note": "process_start = t_main_ns - spawn; process_teardown = reap - t_done_ns; "
                "monitor_other = monitor_total - sum(phases). Medians of parts do not add up "
                "exactly to the median total.",
    }


class ForkExec(Peer):
    name = "forkexec"
    description = "fork+exec of a static no-op C program (bench/tools/noop.c)"

    def prepare(self, ctx):
        ctx.noop  # noqa: B018  (builds it)

    def argv(self, ctx):
        return [ctx.noop]


class ContainerUnshare(Peer):
    name = "container_unshare"
    description = "unshare -fpnmiu --mount-proc <static noop>: new pid/net/mount/ipc/uts namespaces"

    def check(self, ctx):
        if not shutil.which("unshare"):
            raise Skip("unshare not found (apt-get install util-linux)")

    def prepare(self, ctx):
        ctx.noop  # noqa: B018
        r = subprocess.run(self.argv(ctx), capture_output=True, text=True, timeout=self.timeout_s)
        if r.returncode != 0:
            raise Skip("trial run failed (rc %d): %s" % (r.returncode, r.stderr.strip()[-300:]))

    def argv(self, ctx):
        return [shutil.which("unshare"), "-fpnmiu", "--mount-proc", ctx.noop]


def oci_config():
    """The config `crun spec` generates, with the static no-op as the process."""
    caps = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
    return {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["/noop"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted", "ambient")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "noop",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
             "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
        ],
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
                            "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
                            "/proc/sched_debug", "/sys/firmware", "/proc/scsi"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


class ContainerCrun(Peer):
    """crun needs --cgroup-manager=disabled inside a private mount namespace
    with cgroup2 mounted on /sys/fs/cgroup (this host has hybrid cgroups,
    which crun refuses). That namespace is set up once, around the launcher,
    so the timed command is just `crun ... run` (with a fresh id per run;
    `crun run` deletes the container when it exits)."""

    name = "container_crun"
    description = "crun run of an OCI bundle whose rootfs holds only the static no-op"

    def __init__(self):
        self.state = None
        self.bundle = os.path.join(BUILD, "crun-bundle")

    def check(self, ctx):
        for tool in ("crun", "unshare", "mount"):
            if not shutil.which(tool):
                raise Skip("%s not found (scripts/install-bench-deps.sh)" % tool)

    @property
    def wrapper(self):
        return ("unshare", "-m", "--propagation", "private", "--", "sh", "-c",
                'mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "$0" "$@"')

    def prepare(self, ctx):
        rootfs = os.path.join(self.bundle, "rootfs")
        os.makedirs(rootfs, exist_ok=True)
        dst = os.path.join(rootfs, "noop")
        if _stale(dst, ctx.noop):
            shutil.copy2(ctx.noop, dst)
        with open(os.path.join(self.bundle, "config.json"), "w") as f:
            json.dump(oci_config(), f, indent=1)
        base = "/run" if os.access("/run", os.W_OK) else BUILD
        self.state = tempfile.mkdtemp(prefix="wisp-bench-crun-", dir=base)
        self.prefix = "wb%d-" % os.getpid()
        trial = list(self.wrapper) + [a.replace("{i}", "trial") for a in self.argv(ctx)]
        r = subprocess.run(trial, capture_output=True, text=True, timeout=self.timeout_s)
        if r.returncode != 0:
            raise Skip("trial run failed (rc %d): %s" % (r.returncode, r.stderr.strip()[-300:]))

    def argv(self, ctx):
        return [shutil.which("crun") or "crun", "--root", self.state or "<state>",
                "--cgroup-manager=disabled", "run", "--bundle", self.bundle,
                (getattr(self, "prefix", "wb-")) + "{i}"]

    def cleanup(self, ctx):
        if not self.state:
            return
        crun = shutil.which("crun")
        try:
            r = subprocess.run([crun, "--root", self.state, "list", "-q"], capture_output=True,
                               text=True, timeout=30)
            for cid in r.stdout.split():
                subprocess.run([crun, "--root", self.state, "delete", "-f", cid],
                               capture_output=True, timeout=30)
        except Exception as e:  # noqa: BLE001
            log("  crun cleanup: %s" % e)
        shutil.rmtree(self.state, ignore_errors=True)


def host_tsc_khz():
    """Under TCG the guest reads the host TSC; tell the guest its rate, since
    microvm has no HPET/PIT reference and the kernel hangs calibrating."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5).stdout
        m = re.findall(r"tsc: Refined TSC clocksource calibration: ([\d.]+) MHz", out) or \
            re.findall(r"tsc: Detected ([\d.]+) MHz", out)
        if m:
            return int(float(m[-1]) * 1000)
    except Exception:  # noqa: BLE001
        pass
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"cpu MHz\s*:\s*([\d.]+)", f.read())
        if m:
            return int(float(m.group(1)) * 1000)
    except OSError:
        pass
    return None


def version_key(path):
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", path)]


class LinuxVM(Peer):
    name = "linux_vm"
    description = ("qemu-system-x86_64 -accel tcg -M microvm: Debian cloud kernel + busybox "
                   "initramfs whose /init prints a marker and powers off (no disk, no network)")
    slow = True
    timeout_s = 120

    def __init__(self):
        self.kernel = None
        self.initrd = os.path.join(BUILD, "linux-initramfs.cpio")
        self.append = None

    def check(self, ctx):
        if not shutil.which("qemu-system-x86_64"):
            raise Skip("qemu-system-x86_64 not found (apt-get install qemu-system-x86)")
        kernels = sorted(glob.glob("/boot/vmlinuz-*-cloud-amd64"), key=version_key)
        if not kernels:
            raise Skip("no /boot/vmlinuz-*-cloud-amd64 (apt-get install linux-image-cloud-amd64)")
        self.kernel = kernels[-1]
        if not os.access(self.kernel, os.R_OK):
            raise Skip("%s not readable (run as root)" % self.kernel)
        bb = "/bin/busybox" if os.path.exists("/bin/busybox") else shutil.which("busybox")
        if not bb:
            raise Skip("busybox not found (apt-get install busybox-static)")
        with open(bb, "rb") as f:
            head = f.read(1 << 16)
        # A dynamically linked busybox has a PT_INTERP naming the loader.
        if b"/lib64/ld-linux" in head or b"/lib/ld-linux" in head:
            raise Skip("%s is dynamically linked (apt-get install busybox-static)" % bb)
        self.busybox = bb

    def prepare(self, ctx):
        self.build_initramfs()
        khz = host_tsc_khz()
        self.append = "console=ttyS0 quiet panic=-1" + (" tsc_early_khz=%d" % khz if khz else "")
        # Trial boot: it must print the marker from /init and make QEMU exit 0.
        log("  trial boot of %s ..." % os.path.basename(self.kernel))
        try:
            r = subprocess.run(self.argv(ctx), capture_output=True, text=True,
                               timeout=self.timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise Skip("trial boot timed out after %ds" % self.timeout_s)
        if r.returncode != 0 or LINUX_MARKER not in r.stdout:
            raise Skip("trial boot failed (rc %d, marker %s): %s" % (
                r.returncode, "seen" if LINUX_MARKER in r.stdout else "missing",
                (r.stdout + r.stderr).strip()[-500:]))

    def build_initramfs(self):
        with open(self.busybox, "rb") as f:
            bb = f.read()
        init = ("#!/bin/busybox sh\n"
                "/bin/busybox echo %s\n"
                "exec /bin/busybox poweroff -f\n" % LINUX_MARKER).encode()
        data = cpio_newc([
            ("bin", stat.S_IFDIR | 0o755, b"", (0, 0)),
            ("bin/busybox", stat.S_IFREG | 0o755, bb, (0, 0)),
            ("bin/sh", stat.S_IFLNK | 0o777, b"busybox", (0, 0)),
            ("dev", stat.S_IFDIR | 0o755, b"", (0, 0)),
            ("dev/console", stat.S_IFCHR | 0o600, b"", (5, 1)),
            ("init", stat.S_IFREG | 0o755, init, (0, 0)),
        ])
        # Uncompressed: decompressing in an emulated CPU would only add noise.
        tmp = self.initrd + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self.initrd)

    def argv(self, ctx):
        return [shutil.which("qemu-system-x86_64") or "qemu-system-x86_64",
                "-accel", "tcg", "-M", "microvm", "-m", "256M", "-smp", "1",
                "-nodefaults", "-no-user-config", "-display", "none", "-net", "none",
                "-serial", "stdio", "-no-reboot",
                "-kernel", self.kernel or "/boot/vmlinuz-*-cloud-amd64",
                "-initrd", self.initrd, "-append", self.append or "console=ttyS0 quiet panic=-1"]

    def validate(self, ctx, runs):
        ok, notes = Peer.validate(self, ctx, runs)
        booted = [r for r in ok if LINUX_MARKER in r.read("out")]
        if len(booted) != len(ok):
            notes.append("%d/%d runs did not print the /init marker" % (len(ok) - len(booted), len(ok)))
        return booted, notes

    def analyse(self, ctx, runs):
        return {"kernel": self.kernel, "append": self.append,
                "marker_seen_runs": sum(1 for r in runs if LINUX_MARKER in r.read("out"))}


# A warm path (API request to a wisp daemon -> first console line) would be
# another Peer whose check() finds the daemon binary, prepare() starts the
# daemon, measure() times requests itself (returning objects with .ms and
# .status), and cleanup() stops it. Add it to PEERS and, if wanted, a ratio.
PEERS = [WispCold(), WispSyncTeardown(), WispWarm(), WispApiCold(), ForkExec(), ContainerUnshare(), ContainerCrun(), LinuxVM()]

RATIOS = {  # JSON key -> (wisp peer, peer it is compared with)
    "warm_boot_vs_forkexec": ("wisp_warm", "forkexec"),
    "api_cold_boot_vs_forkexec": ("wisp_api_cold", "forkexec"),
    "cold_boot_vs_forkexec": "forkexec",
    "cold_boot_vs_container": "container_unshare",
    "cold_boot_vs_crun": "container_crun",
    "cold_boot_vs_linux_vm": "linux_vm",
}


# --------------------------------------------------------------------------
# machine description


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _version(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        return (r.stdout or r.stderr).strip().splitlines()[0]
    except Exception:  # noqa: BLE001
        return None


def machine_info():
    cpu = re.search(r"model name\s*:\s*(.*)", _read("/proc/cpuinfo"))
    mem = re.search(r"MemTotal:\s*(\d+) kB", _read("/proc/meminfo"))
    info = {
        "hostname": socket.gethostname(),
        "cpu_model": cpu.group(1).strip() if cpu else platform.processor(),
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "mem_total_mib": int(mem.group(1)) // 1024 if mem else None,
        "kernel": "%s %s" % (platform.release(), platform.version()),
        "kvm": os.path.exists("/dev/kvm"),
        "python": platform.python_version(),
        "tools": {
            "qemu": _version(["qemu-system-x86_64", "--version"]) if shutil.which("qemu-system-x86_64") else None,
            "crun": _version(["crun", "--version"]) if shutil.which("crun") else None,
            "unshare": _version(["unshare", "--version"]) if shutil.which("unshare") else None,
        },
    }
    if os.path.exists("/sys/module/kvm_pvm"):
        info["kvm_note"] = "PVM-backed KVM"
    return info


# --------------------------------------------------------------------------
# main


def fmt(v, nd=3):
    return "-" if v is None else ("%.*f" % (nd, v))


def print_table(results, wisp_median):
    rows = [("peer", "runs", "median ms", "min", "max", "p99", "wisp/peer")]
    for name, res in results.items():
        if "skipped" in res:
            rows.append((name, "-", "skipped: " + (res["skipped"].splitlines() or [""])[0], "", "", "", ""))
            continue
        ratio = wisp_median / res["median"] if wisp_median and res.get("median") else None
        rows.append((name, str(res["runs"]), fmt(res["median"]), fmt(res["min"]), fmt(res["max"]),
                     fmt(res["p99"]), fmt(ratio, 4) if ratio is not None else "-"))
    w = [max(len(r[i]) for r in rows if not (len(r) > 2 and r[2].startswith("skipped") and i == 2))
         for i in range(len(rows[0]))]
    for r in rows:
        if r[2].startswith("skipped"):
            print("%-*s  %*s  %s" % (w[0], r[0], w[1], r[1], r[2]))
        else:
            print("  ".join([r[0].ljust(w[0])] + [c.rjust(w[i + 1]) for i, c in enumerate(r[1:])]))


def print_breakdown(bd):
    print()
    if not bd or not bd.get("available"):
        print("wisp breakdown: %s" % ((bd or {}).get("note") or "n/a"))
        return
    print("wisp breakdown (us, over %d runs):" % bd["runs_parsed"])
    print("  %-24s %10s %10s %10s" % ("part", "median", "mean", "max"))
    for k in bd["order"]:
        s = bd["components_us"][k]
        print("  %-24s %10.1f %10.1f %10.1f" % (k, s["median"], s["mean"], s["max"]))
    if bd.get("exits"):
        print("  %-24s %10.1f %10.1f %10.1f" % ("exits (count)", bd["exits"]["median"],
                                                  bd["exits"]["mean"], bd["exits"]["max"]))


def plot(results, out_png):
    """Bar chart of medians (log scale). Silently skipped without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = [n for n, r in results.items() if r.get("median")]
    if not names:
        return False
    med = [results[n]["median"] for n in names]
    lo = [results[n]["median"] - results[n]["min"] for n in names]
    hi = [results[n]["p99"] - results[n]["median"] for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh(names, med, xerr=[lo, hi], color="#4a7ebb", capsize=3)
    ax.set_xscale("log")
    ax.set_xlabel("whole-process time, ms (median; whiskers min..p99), log scale")
    ax.invert_yaxis()
    for i, n in enumerate(names):
        ax.text(results[n]["p99"], i, "  %.2f" % med[i], va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wisp", default="target/release/wisp", help="wisp binary (default: %(default)s)")
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "boot.json"), help="JSON output")
    ap.add_argument("--runs", type=int, default=200, help="measured runs for fast peers (default 200)")
    ap.add_argument("--slow-runs", type=int, default=10,
                    help="measured runs for slow peers, i.e. the QEMU Linux VM (default 10, "
                         "never more than --runs)")
    ap.add_argument("--warmup", type=int, default=5, help="unrecorded warm-up runs (slow peers: 1)")
    ap.add_argument("--peers", default=",".join(p.name for p in PEERS),
                    help="comma-separated subset of: %(default)s")
    ap.add_argument("--plot", default=None,
                    help="PNG path (default: next to --out, if matplotlib is importable)")
    ap.add_argument("--keep-output", action="store_true",
                    help="keep each run's stdout/stderr files under bench/build/runs")
    ap.add_argument("--plot-from", metavar="JSON", help="only plot an existing result file")
    args = ap.parse_args()
    if args.plot_from:
        with open(args.plot_from) as f:
            doc = json.load(f)
        png = args.plot or os.path.splitext(args.plot_from)[0] + ".png"
        return 0 if plot(doc["peers"], png) else 1

    wanted = [n.strip() for n in args.peers.split(",") if n.strip()]
    unknown = set(wanted) - {p.name for p in PEERS}
    if unknown:
        ap.error("unknown peer(s): %s" % ", ".join(sorted(unknown)))
    ctx = Context(args)
    runs_dir = os.path.join(BUILD, "runs")

    results = {}
    wisp_breakdown_res = None
    for peer in [p for p in PEERS if p.name in wanted]:
        n = min(args.runs, args.slow_runs) if peer.slow else args.runs
        warm = min(1, args.warmup) if peer.slow else args.warmup
        entry = {"description": peer.description}
        log("[%s] %d runs (+%d warm-up)" % (peer.name, n, warm))
        outdir = os.path.join(runs_dir, peer.name)
        shutil.rmtree(outdir, ignore_errors=True)
        os.makedirs(outdir)
        try:
            try:
                peer.check(ctx)
                peer.prepare(ctx)
                entry["command"] = peer.command_str(ctx)
                runs = peer.measure(ctx, n, warm, outdir)
                ok, notes = peer.validate(ctx, runs)
                if not ok:
                    raise Skip("no successful run; " + "; ".join(notes))
                ms = [round(r.ms, 4) for r in ok]
                entry.update({"runs": len(ms), "ms": ms})
                entry.update({k: v for k, v in summary(ms).items()})
                if notes:
                    entry["notes"] = notes
                    for x in notes:
                        log("  warning: " + x)
                extra = peer.analyse(ctx, ok)
                if peer.name == "wisp":
                    wisp_breakdown_res = extra.pop("breakdown", None)
                entry.update(extra)
                log("  median %.3f ms" % entry["median"])
            finally:
                peer.cleanup(ctx)
        except Skip as e:
            entry["skipped"] = str(e)
            entry.setdefault("command", peer.command_str(ctx))
            log("  skipped: %s" % e)
        if not args.keep_output:
            shutil.rmtree(outdir, ignore_errors=True)
        results[peer.name] = entry
    if not args.keep_output:
        shutil.rmtree(runs_dir, ignore_errors=True)

    wisp_med = results.get("wisp", {}).get("median")
    ratios = {}
    for key, other in RATIOS.items():
        mine, other = other if isinstance(other, tuple) else ("wisp", other)
        mm = results.get(mine, {}).get("median")
        om = results.get(other, {}).get("median")
        ratios[key] = round(mm / om, 6) if mm and om else None

    doc = {
        "benchmark": "boot",
        "what": "whole-process time (ms) from just before fork() to just after waitpid(), "
                "same C launcher (bench/tools/spawntime.c) for every peer",
        "machine": machine_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds"),
        "runs": args.runs,
        "runs_slow": min(args.runs, args.slow_runs),
        "warmup": args.warmup,
        "peers": results,
        "wisp_breakdown": wisp_breakdown_res if wisp_breakdown_res is not None else
        {"available": False, "note": results.get("wisp", {}).get("skipped", "wisp not measured")},
        "ratios": ratios,
        "ratios_note": "wisp median / peer median (below 1 means wisp is faster)",
    }

    log("[footprint] image sizes, memory of running sleeper VMs")
    doc["footprint"] = footprint(ctx)
    print()
    print_table(results, wisp_med)
    print_breakdown(doc["wisp_breakdown"])
    print()
    print("footprint: %s" % json.dumps(doc["footprint"]))
    print()
    for k, v in ratios.items():
        print("%-24s %s" % (k, fmt(v, 4) if v is not None else "n/a"))

    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(out + ".tmp", out)
    print("\nwrote %s" % out)
    png = args.plot or os.path.splitext(out)[0] + ".png"
    if plot(results, png) or plot_elsewhere(out, png):
        print("wrote %s" % png)
    else:
        log("no plot: matplotlib is not importable (python3-matplotlib)")
    return 0


def plot_elsewhere(json_path, png):
    """Plot from the JSON with the system Python (see `with_system_python`)."""
    return with_system_python(__file__, "--plot-from", json_path, "--plot", png)


def with_system_python(script, *args):
    """matplotlib may live only in the system Python (e.g. python3 is a pyenv
    shim): run `script ARGS` with that interpreter if it is another one.
    True if it ran and succeeded."""
    sys_py = "/usr/bin/python3"
    if not os.path.exists(sys_py) or os.path.realpath(sys_py) == os.path.realpath(sys.executable):
        return False
    r = subprocess.run([sys_py, os.path.abspath(script)] + list(args), capture_output=True, text=True)
    return r.returncode == 0


if __name__ == "__main__":
    sys.exit(main())
