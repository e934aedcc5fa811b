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


def wisp_ticks():
    """CPU ticks used so far by wispd and every VMM process (all threads,
    including KVM's per-VM kernel task)."""
    total = 0
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/comm" % p) as f:
                if f.read().strip() not in ("wispd", "wisp-vmm"):
                    continue
            for t in os.listdir("/proc/%s/task" % p):
                with open("/proc/%s/task/%s/stat" % (p, t)) as f:
                    s = f.read()
                fields = s[s.rindex(")") + 2:].split()
                total += int(fields[11]) + int(fields[12])
        except OSError:
            continue
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wisp", default="target/release/wisp")
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--pool", type=int, default=16)
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "density.json"))
    ap.add_argument("--plot-from", metavar="JSON", help="only redraw the plot of an existing result file")
    ap.add_argument("--plot", help="PNG path (default: next to --out, or to --plot-from)")
    args = ap.parse_args()
    if args.plot_from:
        with open(args.plot_from) as f:
            plot(json.load(f), args.plot or os.path.splitext(args.plot_from)[0] + ".png")
        return
    wispd = os.path.join(os.path.dirname(os.path.abspath(args.wisp)), "wispd")
    # Each VM is a VMM process with two threads: make room for them.
    need = 3 * args.n + 10000
    with open("/proc/sys/kernel/pid_max") as f:
        if int(f.read()) < need:
            with open("/proc/sys/kernel/pid_max", "w") as w:
                w.write(str(need))

    idle_before = idle_cpu_percent(5)
    avail0 = meminfo("MemAvailable")
    # Past the daemon's default quotas on purpose: N sleepers of 16 MiB.
    quotas = ["--max-vms", str(args.n), "--max-guest-memory", "%dM" % (16 * args.n)]
    d = wispapi.Daemon(wispd, os.path.join(ROOT, "build", "images"), pool="16M=%d" % args.pool, extra=quotas)
    api = d.api()
    d.wait_pool(api, args.pool)
    pool_avail = meminfo("MemAvailable")
    boots = []          # (n, us) request -> answer after the first console line (client clock)
    daemon_lines = []   # the answer's first_line_us: arrival at wispd -> first line
    loaded = []         # the answer's boot_us: execute phase in the VMM process (image loaded)
    mem = {}
    ids = []
    t_start = time.time()
    try:
        for n in range(1, args.n + 1):
            # Measure the execute phase at N: give the pool time to refill
            # (the prepare phase is not what this curve is about).
            d.wait_pool(api, args.pool)
            t0 = wispapi.now_ns()
            status, vm = api.call("POST", "/v1/vms?wait_line=true", {"image": "sleeper", "args": ["24h", "60s"]})
            t1 = wispapi.now_ns()
            if status != 201 or vm.get("first_line_us") is None:
                print("VM %d: %s %s" % (n, status, vm), file=sys.stderr)
                break
            ids.append(vm["id"])
            boots.append((n, (t1 - t0) / 1e3))
            daemon_lines.append(vm["first_line_us"])
            loaded.append(vm.get("boot_us"))
            if n in (1000, args.n):
                time.sleep(2)
                mem[n] = round((pool_avail - meminfo("MemAvailable")) / n, 1)
            if n % 500 == 0:
                print("%6d VMs, last boot %.0f us, %.1f s" % (n, boots[-1][1], time.time() - t_start), flush=True)
        reached = len(ids)
        time.sleep(5)
        idle, idle_wisp = idle_window(10)
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
    finally:
        # Batch removal (POST /v1/vms/remove, 256 VMs a request, as
        # `wisp rm -f --all`): from the list request to the last answer.
        rm_s, rm_failed = d.remove_all()
        d.stop(remove_vms=False)
    first = [us for n, us in boots[:100]]
    last = [us for n, us in boots[-100:]]
    doc = {
        "benchmark": "density",
        "machine": {"hostname": socket.gethostname(), "nproc": os.cpu_count(), "kernel": platform.release(),
                    "mem_total_kb": meminfo("MemTotal"), "kvm_note": "PVM-backed KVM" if os.path.exists("/sys/module/kvm_pvm") else None},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "n_target": args.n,
        "n_reached": reached,
        "pool": args.pool,
        "method": METHOD,
        "boot_us": {"what": "POST /v1/vms?wait_line=true (sleeper) -> its answer, sent once the guest's first console "
                            "line has reached wispd; client clock, per VM in start order",
                    "stop": "first_line",
                    "first_100_median": S.median(first), "last_100_median": S.median(last),
                    "median": S.median([b for _, b in boots]), "p99": pct([b for _, b in boots], 99),
                    "series": [round(b, 1) for _, b in boots],
                    "daemon_first_line_series": daemon_lines,
                    "image_loaded_series": loaded},
        "mem_per_vm_kb": {str(k): v for k, v in mem.items()},
        "idle_cpu_percent": round(idle, 2),
        "idle_cpu_percent_wisp": round(idle_wisp, 3),
        "idle_cpu_note": "host-wide busy CPU over 10 s with all VMs idle (the host's own agents included), "
                         "and the share of it used by wispd and the VMM processes",
        "idle_cpu_percent_before": round(idle_before, 2),
        "pause_us": {"median": S.median(pause), "p99": pct(pause, 99)} if pause else None,
        "resume_us": {"median": S.median(resume), "p99": pct(resume, 99)} if resume else None,
        "remove_all_s": round(rm_s, 2),
        "remove_all_failed": rm_failed,
        "remove_all_how": "POST /v1/vms/remove with force, 256 VMs per request (wisp rm -f --all)",
        "ratios": {"last_vs_first_boot": round(S.median(last) / S.median(first), 4)},
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    summary = {k: v for k, v in doc.items() if k not in ("boot_us", "method")}
    summary["boot_us"] = {k: v for k, v in doc["boot_us"].items() if not k.endswith("series")}
    print(json.dumps(summary, indent=1))
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
    s = doc["boot_us"]["series"]
    fig, ax = plt.subplots(figsize=(8, 4))
    stop = ("request -> first console line (each VM)" if doc["boot_us"].get("stop") == "first_line"
            else "request -> image loaded, before the guest runs (each VM)")
    ax.plot(range(1, len(s) + 1), [v / 1000 for v in s], ",", alpha=0.4, label=stop)
    w = 100
    roll = [S.median(s[max(0, i - w):i + 1]) / 1000 for i in range(len(s))]
    ax.plot(range(1, len(s) + 1), roll, "-", color="C1", label="rolling median (100)")
    ld = [v for v in doc["boot_us"].get("image_loaded_series", []) if v is not None]
    if ld:
        lroll = [S.median(ld[max(0, i - w):i + 1]) / 1000 for i in range(len(ld))]
        ax.plot(range(1, len(ld) + 1), lroll, "--", color="C2",
                label="of which: execute phase in the VMM process, image loaded (rolling median)")
    fl = doc.get("first_line_us", {}).get("series")  # results before wait_line: every 100th VM
    if fl:
        ax.plot([n for n, _ in fl], [us / 1000 for _, us in fl], "o", ms=3, color="C2", label="request -> first line (attached hello, every 100th VM)")
    ax.set_xlabel("VMs already running")
    ax.set_ylabel("boot time, ms")
    ax.set_ylim(0, max(roll) * 3 if roll else 5)
    ax.set_title("wisp: boot time of the n-th VM (%d VMs, %s)" % (doc["n_reached"], doc["machine"].get("kvm_note") or "KVM"))
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    main()
