#!/usr/bin/env python3
"""Density benchmark (LightVM Figures 9-10, Denali's 10,000 VMs).

Starts `sleeper` VMs one after another through a private wispd up to N
(default 10,000), and records:
- the boot time of the n-th VM, stopped at a sign from the guest: each VM
  is created with `POST /v1/vms?wait_line=true`, whose answer wispd sends
  only once the guest's first complete console line ("sleeper: sleeping
  ...") has reached it. The client's clock runs from just before the
  request to the answer (`boot_us`); the answer's `first_line_us` is the
  daemon's own figure (the request's arrival -> the first line), and its
  `boot_us` the VMM process's execute phase (image loaded, before the
  guest's first instruction), both kept per VM;
- host memory per VM: drop of MemAvailable / VMs, at 1,000 and at N;
- host CPU while they all idle (from /proc/stat over 10 s);
- pause and resume latency (API round trip) on a sample of VMs.
Writes bench/results/density.json and density.png (`--plot-from JSON`
redraws the plot from a result file).

Results without a `boot_us.stop` field (before wait_line) stopped the
clock earlier: at the plain create's answer, sent once the image was
loaded and before the guest had run; they also timed request -> first line
(`first_line_us`, attached `hello`) on every 100th VM only.

    python3 bench/density.py --wisp target/release/wisp [--n 10000]
"""

import argparse
import datetime
import json
import os
import platform
import random
import socket
import statistics as S
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import wispapi  # noqa: E402


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def cpu_times():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v), idle


def idle_cpu_percent(seconds):
    t0, i0 = cpu_times()
    time.sleep(seconds)
    t1, i1 = cpu_times()
    return 100.0 * (1 - (i1 - i0) / max(1, t1 - t0))


def processes(match):
    """Pids of the processes whose name (`comm`) `match` accepts."""
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/comm" % p) as f:
                if match(f.read().strip()):
                    yield p
        except OSError:
            continue


def ticks(stat_path):
    """utime + stime of a /proc/.../stat file (0 if it is gone)."""
    try:
        with open(stat_path) as f:
            s = f.read()
    except OSError:
        return 0
    fields = s[s.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def wisp_ticks():
    """CPU ticks used so far by wispd and every VMM process (all threads,
    including KVM's per-VM kernel task)."""
    total = 0
    for p in processes(lambda c: c in ("wispd", "wisp-vmm")):
        try:
            tasks = os.listdir("/proc/%s/task" % p)
        except OSError:
            continue
        total += sum(ticks("/proc/%s/task/%s/stat" % (p, t)) for t in tasks)
    return total


def idle_window(seconds):
    """(host CPU %, CPU % used by wisp itself) over `seconds`."""
    w0 = wisp_ticks()
    t0, i0 = cpu_times()
    time.sleep(seconds)
    t1, i1 = cpu_times()
    w1 = wisp_ticks()
    host = 100.0 * (1 - (i1 - i0) / max(1, t1 - t0))
    ncpu = os.cpu_count() or 1
    wisp = 100.0 * (w1 - w0) / (os.sysconf("SC_CLK_TCK") * seconds * ncpu)
    return host, wisp


def pct(vals, p):
    v = sorted(vals)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


METHOD = ("Each VM is created with POST /v1/vms?wait_line=true (sleeper 24h 60s, 16 MiB, one request at a time, "
          "after the pool has refilled): wispd answers once the guest's first complete console line has reached it, "
          "so a VM's boot time runs from just before the request to that answer and stops at a sign from the guest "
          "itself, for every VM. The answer's first_line_us (the request's arrival at wispd -> first line) and "
          "boot_us (the VMM process's execute phase: image loaded, before the guest runs) are kept per VM.")


def kdamond_ticks():
    """CPU ticks used so far by the kernel's DAMON threads (kdamond.*)."""
    return sum(ticks("/proc/%s/stat" % p) for p in processes(lambda c: c.startswith("kdamond")))


def wisp_tasks():
    """(VMM processes, their tasks: threads and KVM's kernel tasks)."""
    procs = tasks = 0
    for p in processes(lambda c: c == "wisp-vmm"):
        try:
            tasks += len(os.listdir("/proc/%s/task" % p))
            procs += 1
        except OSError:
            continue
    return procs, tasks


MEMINFO_KEYS = ["AnonPages", "SUnreclaim", "SReclaimable", "KernelStack", "PageTables", "Shmem", "Mapped"]


def run_mode(args, wispd, mode, per_process):
    """Start up to N sleepers through a private wispd in one mode; measure."""
    quotas = ["--max-vms", str(args.n), "--max-guest-memory", "%dM" % (16 * args.n)]
    extra = quotas + ["--vms-per-process", str(per_process)]
    pool = args.pool if per_process == 1 else 1
    avail_before = meminfo("MemAvailable")
    d = wispapi.Daemon(wispd, os.path.join(ROOT, "build", "images"), pool="16M=%d" % pool, extra=extra)
    api = d.api()
    d.wait_pool(api, pool)
    pool_avail = meminfo("MemAvailable")
    base = {k: meminfo(k) for k in MEMINFO_KEYS}
    boots, daemon_lines, loaded, mem, ids = [], [], [], {}, []
    per_vm = {}
    t_start = time.time()
    rm_s, rm_failed = None, None
    try:
        for n in range(1, args.n + 1):
            # Measure the execute phase at N: give the pool time to refill
            # (the prepare phase is not what this curve is about).
            d.wait_pool(api, pool)
            # A group with room: its next VM prepared too (the first VM of
            # each group, every per_process-th, starts its process instead).
            if per_process > 1 and (n - 1) % per_process != 0:
                d.wait_group_spare(api)
            t0 = wispapi.now_ns()
            status, vm = api.call("POST", "/v1/vms?wait_line=true", {"image": "sleeper", "args": ["24h", "60s"]})
            t1 = wispapi.now_ns()
            if status != 201 or vm.get("first_line_us") is None:
                print("%s: VM %d: %s %s" % (mode, n, status, vm), file=sys.stderr)
                break
            ids.append(vm["id"])
            boots.append((t1 - t0) / 1e3)
            daemon_lines.append(vm["first_line_us"])
            loaded.append(vm.get("boot_us"))
            if n in (1000, args.n):
                time.sleep(2)
                mem[n] = round((pool_avail - meminfo("MemAvailable")) / n, 1)
                if n == args.n:
                    per_vm = {k: round((meminfo(k) - base[k]) / n, 1) for k in MEMINFO_KEYS}
            if n % 500 == 0:
                print("%s: %6d VMs, last boot %.0f us, %.1f s" % (mode, n, boots[-1], time.time() - t_start), flush=True)
        reached = len(ids)
        time.sleep(5)
        k0 = kdamond_ticks()
        idle, idle_wisp = idle_window(10)
        kdamond = 100.0 * (kdamond_ticks() - k0) / (os.sysconf("SC_CLK_TCK") * 10)
        procs, tasks = wisp_tasks()
        sample = random.Random(1).sample(ids, min(200, len(ids)))
        pause, resume = [], []
        for vid in sample:
            # The first call opens the daemon's control connection to the VM;
            # measure the steady state after it.
            api.call("POST", "/v1/vms/%s/pause" % vid)
            api.call("POST", "/v1/vms/%s/resume" % vid)
            t0 = wispapi.now_ns()
            s1, _ = api.call("POST", "/v1/vms/%s/pause" % vid)
            t1 = wispapi.now_ns()
            s2, _ = api.call("POST", "/v1/vms/%s/resume" % vid)
            t2 = wispapi.now_ns()
            if s1 == 200 and s2 == 200:
                pause.append((t1 - t0) / 1e3)
                resume.append((t2 - t1) / 1e3)
        # Batch removal (POST /v1/vms/remove, 256 VMs a request, as
        # `wisp rm -f --all`): from the list request to the last answer.
        rm_s, rm_failed = d.remove_all()
    finally:
        d.stop(remove_vms=rm_s is None)
    left_kb = avail_before - meminfo("MemAvailable")
    first, last = boots[:100], boots[-100:]
    return {
        "vms_per_process": per_process,
        "pool": pool,
        "n_reached": reached,
        "boot_us": {"first_100_median": S.median(first), "last_100_median": S.median(last),
                    "median": S.median(boots), "p99": pct(boots, 99),
                    "series": [round(b, 1) for b in boots],
                    "daemon_first_line_series": daemon_lines,
                    "image_loaded_series": loaded},
        "mem_per_vm_kb": {str(k): v for k, v in mem.items()},
        "meminfo_per_vm_kb": per_vm,
        "idle_cpu_percent": round(idle, 2),
        "idle_cpu_percent_wisp": round(idle_wisp, 3),
        "kdamond_cpu_percent_of_a_core": round(kdamond, 2),
        "vmm_processes": procs,
        "tasks_per_vm": round(tasks / max(1, reached), 2),
        "pause_us": {"median": S.median(pause), "p99": pct(pause, 99)} if pause else None,
        "resume_us": {"median": S.median(resume), "p99": pct(resume, 99)} if resume else None,
        "remove_all_s": round(rm_s, 2) if rm_s is not None else None,
        "remove_all_failed": rm_failed,
        "memory_left_after_removal_kb": left_kb,
        "ratios": {"last_vs_first_boot": round(S.median(last) / S.median(first), 4)},
    }


MODES = {"process": 1, "grouped": 64}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wisp", default="target/release/wisp")
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--pool", type=int, default=16)
    # Grouped first: a VMM process per VM leaves the host busier after its
    # removal (10,000 processes' worth of the init agent's and the kernel's
    # catching up), which would weigh on whichever mode ran next.
    ap.add_argument("--modes", default="grouped,process",
                    help="which modes, in order: grouped (wispd --vms-per-process 64), process (a VMM process per VM)")
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "density.json"))
    ap.add_argument("--plot-from", metavar="JSON", help="only redraw the plot of an existing result file")
    ap.add_argument("--plot", help="PNG path (default: next to --out, or to --plot-from)")
    args = ap.parse_args()
    if args.plot_from:
        with open(args.plot_from) as f:
            plot(json.load(f), args.plot or os.path.splitext(args.plot_from)[0] + ".png")
        return
    wispd = os.path.join(os.path.dirname(os.path.abspath(args.wisp)), "wispd")
    # A VMM process per VM has two tasks (its thread, KVM's kernel task):
    # make room for them.
    need = 3 * args.n + 10000
    with open("/proc/sys/kernel/pid_max") as f:
        if int(f.read()) < need:
            with open("/proc/sys/kernel/pid_max", "w") as w:
                w.write(str(need))
    idle_before = idle_cpu_percent(5)
    modes = {}
    for m in args.modes.split(","):
        modes[m] = run_mode(args, wispd, m, MODES[m])
    ratios = {}
    for m, r in modes.items():
        suffix = "" if m == "grouped" or len(modes) == 1 else "_" + m
        ratios["last_vs_first_boot" + suffix] = r["ratios"]["last_vs_first_boot"]
    doc = {
        "benchmark": "density",
        "machine": {"hostname": socket.gethostname(), "nproc": os.cpu_count(), "kernel": platform.release(),
                    "mem_total_kb": meminfo("MemTotal"), "kvm_note": "PVM-backed KVM" if os.path.exists("/sys/module/kvm_pvm") else None},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "n_target": args.n,
        "method": METHOD,
        "boot_stop": "first_line",
        "boot_what": "POST /v1/vms?wait_line=true (sleeper) -> its answer, sent once the guest's first console "
                     "line has reached wispd; client clock, per VM in start order",
        "idle_cpu_note": "host-wide busy CPU over 10 s with all VMs idle (the host's own agents included), "
                         "the share of it used by wispd and the VMM processes (all their tasks), and the kernel's "
                         "DAMON thread in % of one core",
        "idle_cpu_percent_before": round(idle_before, 2),
        "remove_all_how": "POST /v1/vms/remove with force, 256 VMs per request (wisp rm -f --all)",
        "modes": modes,
        "ratios": ratios,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    summary = {m: {k: v for k, v in r.items() if k != "boot_us"} for m, r in modes.items()}
    for m, r in modes.items():
        summary[m]["boot_us"] = {k: v for k, v in r["boot_us"].items() if not k.endswith("series")}
    print(json.dumps({"ratios": ratios, "modes": summary}, indent=1))
    plot(doc, args.plot or os.path.splitext(args.out)[0] + ".png")


def plot(doc, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        # matplotlib from Debian's python3 (python3-matplotlib), given the document itself.
        import subprocess
        import tempfile
        if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(doc, f)
            try:
                subprocess.run(["/usr/bin/python3", "-c",
                                "import sys,json; sys.path.insert(0,%r); import density; density.plot(json.load(open(%r)), %r)"
                                % (BENCH, f.name, png)])
            finally:
                os.unlink(f.name)
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    modes = doc.get("modes") or {"process": doc}  # results before modes: one process-per-VM run
    w = 100
    top = 0
    for i, (m, r) in enumerate(modes.items()):
        s = r["boot_us"]["series"]
        label = "%s (%s)" % (m, "a VMM process per VM" if r.get("vms_per_process", 1) == 1 else
                             "%d VMs per VMM process" % r["vms_per_process"])
        ax.plot(range(1, len(s) + 1), [v / 1000 for v in s], ",", alpha=0.3, color="C%d" % (2 * i))
        roll = [S.median(s[max(0, j - w):j + 1]) / 1000 for j in range(len(s))]
        ax.plot(range(1, len(s) + 1), roll, "-", color="C%d" % (2 * i + 1), label=label + ": rolling median (100)")
        top = max(top, max(roll) if roll else 0)
    ax.set_xlabel("VMs already running")
    ax.set_ylabel("boot time (request -> first console line), ms")
    ax.set_ylim(0, top * 3 if top else 5)
    ax.set_title("wisp: boot time of the n-th VM (%d VMs, %s)" % (doc["n_target"], doc["machine"].get("kvm_note") or "KVM"))
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    main()
