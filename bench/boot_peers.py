"""The boot benchmark's peers (ways to start a no-op) and PEERS, the list
bench/boot.py measures. See boot.py.
"""

import glob
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import statistics
import tempfile
import time

from common import (BENCH, BUILD, ROOT, TOOLS, Skip, _stale, cc, cpio_newc, host_tsc_khz, log, spawntime,
                    summary, version_key)

LINUX_MARKER = "WISP_BENCH_LINUX_BOOTED"
STATS_PREFIX = "wisp-stats:"


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
    first_line = False    # time until the first line of output (spawntime -l)

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
            return pre + "spawntime %s-- " % ("-l " if self.first_line else "") + shlex.join(self.argv(ctx))
        except Exception:  # noqa: BLE001
            return None

    def measure(self, ctx, runs, warmup, outdir):
        return spawntime(ctx, self.argv(ctx), runs, warmup, self.timeout_s, self.wrapper, outdir,
                         first_line=self.first_line)

    def validate(self, ctx, runs):
        """Return (ok_runs, notes). Default: exit status 0 (and, timed to
        the first line, a line printed)."""
        bad = [r for r in runs if r.status != 0]
        notes = []
        if bad:
            notes.append("%d/%d runs exited non-zero (e.g. status %d: %s)" % (
                len(bad), len(runs), bad[0].status, bad[0].read("err").strip()[-300:]))
        ok = [r for r in runs if r.status == 0]
        lineless = [r for r in ok if r.ms is None]
        if lineless:
            notes.append("%d/%d runs printed no line" % (len(lineless), len(runs)))
        return [r for r in ok if r.ms is not None], notes

    def analyse(self, ctx, runs):
        """Extra per-peer results (dict) merged into the peer's JSON entry."""
        return {}


# `wisp run` boots in its own process only when no daemon answers: the
# cold peers pin the socket to a path where none can.
NO_DAEMON = "/nonexistent/wisp-bench-no-daemon.sock"


class WispCold(Peer):
    name = "wisp"
    description = "wisp run --stats noop: cold boot of a unikernel VM that exits 0 at once (no daemon: WISP_SOCKET pinned to a path with none)"
    timeout_s = 20

    def check(self, ctx):
        if not os.path.exists(ctx.wisp):
            raise Skip("wisp binary not found at %s (build it: cargo build --release)" % ctx.wisp)
        if not os.access(ctx.wisp, os.X_OK):
            raise Skip("%s is not executable" % ctx.wisp)

    def prepare(self, ctx):
        os.environ["WISP_SOCKET"] = NO_DAEMON
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

    def cleanup(self, ctx):
        os.environ.pop("WISP_SOCKET", None)

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
        super().cleanup(ctx)


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
    shells; each run is POST /v1/vms?attach=true for `hello`, sent by a C
    client (bench/tools/warmtime.c) on an open connection, until the
    guest's first console line arrives at that client. Before each run the
    pool is allowed to refill, so every request takes a prepared shell (the
    execute phase only; the pool's shells hold `hello` loaded ahead once it
    has been asked for: the warm-up runs)."""
    name = "wisp_warm"
    description = ("wispd API request on an open connection -> guest's first console line at the client (hello), "
                   "shell from the pool; C client (bench/tools/warmtime.c)")
    pool = 8
    prepared = True

    def wispd(self, ctx):
        return os.path.join(os.path.dirname(os.path.abspath(ctx.wisp)), "wispd")

    def check(self, ctx):
        if not os.path.exists(self.wispd(ctx)):
            raise Skip("wispd not found next to %s" % ctx.wisp)

    def command_str(self, ctx):
        return "warmtime SOCKET '{\"image\": \"hello\"}' (POST /v1/vms?attach=true, until the first line)"

    def measure(self, ctx, runs, warmup, outdir):
        sys.path.insert(0, BENCH)
        import wispapi
        client = cc(os.path.join(TOOLS, "warmtime.c"), os.path.join(BUILD, "warmtime"))
        pool = "16M=%d" % (self.pool if self.prepared else 0)
        d = wispapi.Daemon(self.wispd(ctx), os.path.join(ROOT, "build", "images"), pool=pool)
        try:
            ctl = d.api()
            out, traces = [], []
            for i in range(warmup + runs):
                if self.prepared:
                    d.wait_pool(ctl, self.pool)
                time.sleep(0.01)  # let the previous VM's teardown finish
                r = subprocess.run([client, d.socket, json.dumps({"image": "hello"})], capture_output=True,
                                   text=True, timeout=self.timeout_s)
                f = r.stdout.split()
                if r.returncode != 0 or len(f) != 4:
                    raise RuntimeError("warmtime: %s %s" % (r.stdout.strip(), r.stderr.strip()))
                start, line, vm = int(f[0]), int(f[1]), f[3]
                # The daemon records the trace as the VMM process answers it,
                # which may be just after the client read the console.
                deadline = time.time() + 1
                while True:
                    _, info = ctl.call("GET", "/v1/vms/%s" % vm)
                    if (info or {}).get("boot_trace", {}).get("first_output_ns") or time.time() > deadline:
                        break
                    time.sleep(0.001)
                ctl.call("DELETE", "/v1/vms/%s?force=true" % vm)
                if i >= warmup:
                    out.append(ApiRun(line - start))
                    if info and info.get("boot_trace"):
                        traces.append((start, line, info["boot_trace"]))
            self.hops = hops(traces) if self.prepared else None
            return out
        finally:
            d.stop()

    def analyse(self, ctx, runs):
        hops = getattr(self, "hops", None)
        return {"hops": hops} if hops else {}


def hops(traces):
    """The warm path by hop, from each measured run's own clocks: the
    client's (start, first line) and the toolstack's (`boot_trace`: the
    daemon's, the VMM process's), all CLOCK_MONOTONIC on this host."""
    if not traces:
        return None
    legs = [
        ("client_to_daemon", "the request written by the client -> its first byte read by the daemon's connection thread",
         lambda s, l, t: t["arrived_ns"] - s),
        ("daemon", "HTTP parsing, admission, a shell from the pool, the start command sent",
         lambda s, l, t: t["sent_ns"] - t["arrived_ns"]),
        ("daemon_to_vmm", "the start command (with the client's connection) reaching the VMM process",
         lambda s, l, t: t["received_ns"] - t["sent_ns"]),
        ("vmm_execute", "the VMM process's execute phase: the preloaded image's boot-info page (its registers, "
                        "family and control block were made with the preload), the devices (start received -> "
                        "guest about to run)",
         lambda s, l, t: t["entered_ns"] - t["received_ns"]),
        ("guest_to_first_output", "the guest running to its first console write (one exit), that write sent to "
                                  "the client with the response head (the reply to the daemon goes after it)",
         lambda s, l, t: t["first_output_ns"] - t["entered_ns"]),
        ("output_to_client", "the first output on the client's socket -> read by the client",
         lambda s, l, t: l - t["first_output_ns"]),
    ]
    rows = [(s, l, t) for s, l, t in traces if t.get("first_output_ns")]
    med = lambda xs: round(statistics.median(xs) / 1e3, 1)  # noqa: E731
    return {
        "runs": len(rows),
        "what": "medians (µs) per hop of the measured warm runs (POST /v1/vms?attach=true, hello), from the "
                "client's clock and the toolstack's boot_trace (host CLOCK_MONOTONIC)",
        "total": med([l - s for s, l, _ in rows]),
        "legs": {name: med([f(s, l, t) for s, l, t in rows]) for name, _, f in legs},
        "notes": {name: note for name, note, _ in legs},
    }


class WispApiCold(WispWarm):
    """The same request with an empty pool: prepare (VMM process, KVM VM,
    first entry) and execute on the request path."""
    name = "wisp_api_cold"
    description = "wispd API request -> first console line (hello), no prepared shell (prepare + execute)"
    prepared = False


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
    program = "noop"      # a static C program in bench/tools, built by Context

    def prepare(self, ctx):
        getattr(ctx, self.program)  # builds it

    def argv(self, ctx):
        return [getattr(ctx, self.program)]


class ForkExecFirstLine(ForkExec):
    """Like with like for the warm path, which stops at the guest's first
    console line: fork+exec of a static C hello, timed until its line
    arrives on the launcher's pipe (spawntime -l), not until it is reaped."""
    name = "forkexec_first_line"
    description = "fork+exec of a static C hello (bench/tools/hello.c) until its first line of output"
    program = "hello"
    first_line = True


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


class LinuxVM(Peer):
    name = "linux_vm"
    description = ("Linux VM under QEMU TCG (software emulation: KVM on this host cannot boot a stock Linux "
                   "kernel): qemu-system-x86_64 -accel tcg -M microvm, Debian cloud kernel + busybox "
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
PEERS = [WispCold(), WispSyncTeardown(), WispWarm(), WispApiCold(), ForkExec(), ForkExecFirstLine(), ContainerUnshare(),
         ContainerCrun(), LinuxVM()]
