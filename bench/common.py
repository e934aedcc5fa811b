"""Helpers shared by the benchmark scripts (boot.py, fork.py, net.py): paths,
logging, C builds, an initramfs writer, statistics, the spawntime launcher,
host facts and the machine description. A leaf: imports no bench script.
"""

import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
TOOLS = os.path.join(BENCH, "tools")
BUILD = os.path.join(BENCH, "build")


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


def cc(src, out, static=False, libs=()):
    if not _stale(out, src):
        return out
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise Skip("no C compiler (install gcc, libc6-dev: scripts/install-bench-deps.sh)")
    cmd = [compiler, "-O2", "-Wall"] + (["-static"] if static else []) + ["-o", out, src] + list(libs)
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
        self._hello = None

    @property
    def spawntime(self):
        if not self._spawntime:
            self._spawntime = cc(os.path.join(TOOLS, "spawntime.c"), os.path.join(BUILD, "spawntime"))
        return self._spawntime

    @property
    def hello(self):
        if not self._hello:
            self._hello = cc(os.path.join(TOOLS, "hello.c"), os.path.join(BUILD, "hello"), static=True)
        return self._hello

    @property
    def noop(self):
        if not self._noop:
            self._noop = cc(os.path.join(TOOLS, "noop.c"), os.path.join(BUILD, "noop"), static=True)
        return self._noop


class Run:
    """One measured run: times, status, and the child's captured output."""

    def __init__(self, spawn_ns, reap_ns, status, out_path, err_path, line_ns=None):
        self.spawn_ns, self.reap_ns, self.status = spawn_ns, reap_ns, status
        self.out_path, self.err_path = out_path, err_path
        # With first_line: when the first line of output arrived (0: none).
        self.line_ns = line_ns

    @property
    def ms(self):
        """Spawn until reaped; with first_line, spawn until the first line
        of output (a run that printed none has no figure: None)."""
        if self.line_ns is not None:
            return (self.line_ns - self.spawn_ns) / 1e6 if self.line_ns else None
        return (self.reap_ns - self.spawn_ns) / 1e6

    def read(self, which="err"):
        try:
            with open(self.err_path if which == "err" else self.out_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


def spawntime(ctx, argv, runs, warmup, timeout_s, wrapper=(), outdir=None, first_line=False):
    """Run argv `runs` times (after `warmup` unrecorded runs) under the launcher.

    wrapper: argv prefix that sets up an environment for the launcher itself
    (e.g. a private mount namespace); it runs once, outside the timed window.
    The child's stdout/stderr go to files in outdir (same cost for every peer).
    first_line: time each run until the first line of its output (-l).
    """
    cmd = list(wrapper) + [ctx.spawntime, "-n", str(runs), "-w", str(warmup),
                           "-t", str(timeout_s), "-d", outdir] + (["-l"] if first_line else []) + ["--"] + list(argv)
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
        f = line.split()
        result.append(Run(int(f[0]), int(f[1]), int(f[2]), os.path.join(outdir, "%d.out" % i),
                          os.path.join(outdir, "%d.err" % i), int(f[3]) if len(f) > 3 else None))
    return result


# --------------------------------------------------------------------------
# host facts


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
# output


def fmt(v, nd=3):
    return "-" if v is None else ("%.*f" % (nd, v))


def with_system_python(script, *args):
    """matplotlib may live only in the system Python (e.g. python3 is a pyenv
    shim): run `script ARGS` with that interpreter if it is another one.
    True if it ran and succeeded."""
    sys_py = "/usr/bin/python3"
    if not os.path.exists(sys_py) or os.path.realpath(sys_py) == os.path.realpath(sys.executable):
        return False
    r = subprocess.run([sys_py, os.path.abspath(script)] + list(args), capture_output=True, text=True)
    return r.returncode == 0


def bench_args(doc, default_out, plot, add=lambda ap: None):
    """A benchmark's arguments (`add` adds its own) with `--out`, the
    results' JSON, and `--plot-only`; `args.png` is the plot beside it.
    With `--plot-only` the plot is drawn from `--out` and None returned."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add(ap)
    ap.add_argument("--out", default=default_out)
    ap.add_argument("--plot-only", action="store_true", help="only draw the plot of --out's results")
    args = ap.parse_args()
    args.png = os.path.splitext(args.out)[0] + ".png"
    if args.plot_only:
        import json
        with open(args.out) as f:
            plot(json.load(f), args.png)
        return None
    return args


def write_result(doc, args, plot, script):
    """Write a benchmark's result `doc` to `args.out`, draw its plot beside
    it (`args.png`), and log its ratios."""
    import json
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    draw(plot, doc, args.png, script, args.out)
    log(json.dumps(doc["ratios"], indent=1))


def draw(plot, doc, png, script, out):
    """Draw `doc` into `png` with `plot(doc, png)` (False without
    matplotlib), or with the system Python running `script --plot-only`."""
    return plot(doc, png) or with_system_python(script, "--plot-only", "--out", out)


def kill_pidns_holder(state_dir):
    """wispd's PID-namespace holder outlives the daemon on purpose (for a
    restarted one); a benchmark's own daemon leaves none behind."""
    try:
        with open(os.path.join(state_dir, "pidns")) as f:
            pid = json.load(f)["pid"]
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmdline = f.read()
        if b"__pidns" in cmdline and state_dir.encode() in cmdline:
            os.kill(pid, 9)
    except (OSError, ValueError, KeyError):
        pass


def open_loop(n, gap_s, one, start=None):
    """Call `one(i)` for i in 0..n on a thread of its own, the i-th at
    `start` + i * `gap_s` whatever the others do (an open loop of arrivals,
    paced by short sleeps: this is the load, not a synchronisation); wait
    for all of them."""
    import threading
    start = start if start is not None else time.perf_counter() + 0.05
    threads = []
    for i in range(n):
        at = start + i * gap_s
        while time.perf_counter() < at:
            time.sleep(min(0.0005, max(0.0, at - time.perf_counter())))
        t = threading.Thread(target=one, args=(i,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
