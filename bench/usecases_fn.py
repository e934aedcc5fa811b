"""Item 2 of issue 18, the functions service (LightVM §7.4, Figures 17
and 18): a compute function, the first DIGITS decimals of e by the spigot
algorithm (integers only; the `compute` app, and bench/tools/compute.c as
the same code for the host), called over HTTP through one `wisp fn serve`:

- `vm`: each call on a fresh VM of the `compute` image (a prepared shell
  of wispd's pool, a VMM process per VM), removed after; `vm_group`: the
  same under a wispd with groups (`--vms-per-process 64`);
- `process`: each call a fresh host process of the static C twin
  (`--process-fn`): the same server, the same limits, no VM.

First each is called one at a time (CALIBRATE calls): its service time.
Then LightVM's experiment: 1,000 calls in an open loop, arriving a little
faster than the host can serve them with processes (LightVM: 250 ms
inter-arrivals where 266 ms kept its cores busy; here the gap is 0.94 x
the process's service time / the host's CPUs), the same arrivals for both.
Measured per call: the time from its arrival to its answer (the nth
call's, Figure 17), and how many calls are outstanding over time (the
backlog, Figure 18). The daemon's state is on a tmpfs of its own
(wispapi.Daemon's `tmpfs`). Run by bench/usecases.py."""

import http.client
import json
import os
import statistics
import subprocess
import threading
import time

import common
import wispapi

log = common.log
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = 8214
CALIBRATE = 20


def call(fn, digits):
    """One call: (status, seconds)."""
    t = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
    try:
        c.request("POST", "/functions/" + fn, body=json.dumps({"args": [str(digits)]}))
        r = c.getresponse()
        r.read()
        return r.status, time.perf_counter() - t
    finally:
        c.close()


def open_loop(fn, digits, n, gap):
    """n calls, one every `gap` seconds whatever the others do: each
    call's (arrival, latency, status) and the backlog at each event."""
    out = [None] * n
    events = []  # (time, +1 arrival / -1 answer)
    lock = threading.Lock()
    start = time.perf_counter() + 0.05

    def one(i):
        at = time.perf_counter()
        with lock:
            events.append((at - start, 1))
        try:
            status, took = call(fn, digits)
        except OSError:
            status, took = 0, time.perf_counter() - at
        with lock:
            events.append((at - start + took, -1))
        out[i] = (at - start, took, status)

    common.open_loop(n, gap, one, start)
    events.sort()
    backlog, level = [], 0
    for t, d in events:
        level += d
        backlog.append((round(t, 4), level))
    return out, backlog


class Serving:
    """A private wispd (`extra` its arguments) and `wisp fn serve` over it,
    serving `vm` (the compute image) and `process` (its C twin)."""

    def __init__(self, args, extra, compute_c):
        wispd = os.path.join(os.path.dirname(os.path.abspath(args.wisp)), "wispd")
        self.d = wispapi.Daemon(wispd, os.path.join(ROOT, "build", "images"), pool="16M=4", tmpfs=True, extra=extra)
        self.server = subprocess.Popen(
            [os.path.abspath(args.wisp), "fn", "serve", "--listen", "127.0.0.1:%d" % PORT, "--time-limit", "600s",
             "--fn", "vm=compute", "--process-fn", "process=" + compute_c],
            env=dict(os.environ, WISP_SOCKET=self.d.socket), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.server.stderr.readline()  # "serving on ..."

    def stop(self):
        self.server.kill()
        self.server.wait()
        self.d.stop()


def calibrate(fn, digits):
    """One call at a time: the median service time, in seconds."""
    call(fn, digits)  # (the image cached, a group made)
    times = []
    for _ in range(CALIBRATE):
        st, took = call(fn, digits)
        if st != 200:
            raise RuntimeError("%s: status %d" % (fn, st))
        times.append(took)
    return statistics.median(times)


def loaded(fn, args, gap, service, label=None):
    """The open loop of `fn` (logged as `label`): its results."""
    calls, backlog = open_loop(fn, args.digits, args.calls, gap)
    lat = [c[1] for c in calls]
    failed = sum(1 for c in calls if c[2] != 200)
    statuses = {}
    for c in calls:
        statuses[str(c[2])] = statuses.get(str(c[2]), 0) + 1
    done = max(c[0] + c[1] for c in calls)
    r = {
        "service_ms": round(service * 1e3, 3),
        "latency_ms": common.summary([x * 1e3 for x in lat], 3),
        "nth_latency_ms": [round(x * 1e3, 2) for x in lat],
        "completion_s": round(done, 3),
        "max_backlog": max(b for _, b in backlog),
        "backlog": backlog[:: max(1, len(backlog) // 400)],
        "failed": failed,
        "statuses": statuses,
    }
    log("[usecases] fn %s: one at a time %.2f ms; %d calls every %.2f ms: median latency %.1f ms, all done in %.2f s, backlog at most %d, failed %d" % (
        label or fn, service * 1e3, args.calls, gap * 1e3, r["latency_ms"]["median"], done, r["max_backlog"], failed))
    return r


def run(args):
    """The fn part: its results and ratios."""
    compute_c = common.cc(os.path.join(ROOT, "bench", "tools", "compute.c"), os.path.join(ROOT, "bench", "build", "compute"), static=True)
    cpus = os.cpu_count() or 1
    res = {}
    # The process peer first, under the first daemon's server: its service
    # time sets the load for all.
    s = Serving(args, [], compute_c)
    try:
        service = calibrate("process", args.digits)
        gap = 0.94 * service / cpus
        res["process"] = loaded("process", args, gap, service)
        res["vm"] = loaded("vm", args, gap, calibrate("vm", args.digits))
    finally:
        s.stop()
    s = Serving(args, ["--vms-per-process", "64"], compute_c)
    try:
        res["vm_group"] = loaded("vm", args, gap, calibrate("vm", args.digits), "vm_group")
    finally:
        s.stop()
    # The headline is the design a functions service would run: groups.
    ratios = {
        "fn_completion_vs_process": round(res["vm_group"]["completion_s"] / res["process"]["completion_s"], 3),
        "fn_call_vs_process": round(res["vm_group"]["service_ms"] / res["process"]["service_ms"], 3),
        "fn_latency_under_load_vs_process": round(res["vm_group"]["latency_ms"]["median"] / res["process"]["latency_ms"]["median"], 3),
        "fn_max_backlog": res["vm_group"]["max_backlog"],
        "fn_max_backlog_process": res["process"]["max_backlog"],
        "fn_vmm_per_vm_completion_vs_process": round(res["vm"]["completion_s"] / res["process"]["completion_s"], 3),
        "fn_vmm_per_vm_call_vs_process": round(res["vm"]["service_ms"] / res["process"]["service_ms"], 3),
    }
    note = ("fn_*: the same compute function (%d decimals of e) called through one `wisp fn serve`, on a fresh VM per call"
            " (VMs of group processes; fn_vmm_per_vm_*: a VMM process per VM) or a fresh process per call; completion = time until"
            " all %d calls of the open loop (arriving 6%% faster than the host serves processes) are answered; call = one call"
            " at a time, median; latency_under_load = median arrival-to-answer in the open loop; below 1: the VM is faster"
            % (args.digits, args.calls))
    part = {"method": __doc__.strip(), "digits": args.digits, "calls": args.calls, "gap_ms": round(gap * 1e3, 3), "cpus": cpus, "peers": res}
    return part, ratios, note, {"fn_call_vs_process": 1.5, "fn_completion_vs_process": 1.5}


def plot(ax_pair, part):
    """The nth call's latency (Figure 17) and the backlog over time (Figure 18)."""
    names = {"vm": "a VM per call (wisp)", "vm_group": "a VM per call, groups (wisp)", "process": "a process per call"}
    for p, r in part["peers"].items():
        ax_pair[0].plot(range(1, len(r["nth_latency_ms"]) + 1), r["nth_latency_ms"], label=names.get(p, p), linewidth=0.8)
        ax_pair[1].plot([t for t, _ in r["backlog"]], [b for _, b in r["backlog"]], label=names.get(p, p), linewidth=0.8)
    ax_pair[0].set_xlabel("call #")
    ax_pair[0].set_ylabel("arrival to answer, ms")
    ax_pair[0].set_title("fn: %d calls, one every %.1f ms" % (part["calls"], part["gap_ms"]), fontsize=9)
    ax_pair[1].set_xlabel("time, s")
    ax_pair[1].set_ylabel("calls outstanding")
    ax_pair[1].set_title("fn: backlog", fontsize=9)
    for ax in ax_pair:
        ax.legend(fontsize=7)
