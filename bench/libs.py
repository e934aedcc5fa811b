#!/usr/bin/env python3
"""Shared libraries (issue 17, item 5; KylinX §5): live update of a library
in a running VM, and host memory of many VMs sharing one library. A private
wispd (pool of 16 MiB shells); libraries from `make libs`.

- update (KylinX's experiment: libm's 111 functions and 111 variables in
  ~5 ms): a `libbench update` VM calls all 111 functions of `bench.so`
  (each adds to its own variable) in rounds 1 ms apart; REPS times, the
  library is replaced by its next version (`bench2.so`, then back to
  `bench.so`, ...) with `POST /v1/vms/{id}/update`, client clock from the
  request to its answer (sent once the guest switched and the old library
  is unmapped): `update_ms`. The guest measures its own pause — its
  `library` hypercall, in which the monitor carries the 111 variables over
  and switches the entry — and checks that every variable was carried
  (`update_pause_us`, the guest's clock; the monitor's own figure for the
  switch is `held_us`). Also: the VMM process's figure (`vmm_update_ms`)
  and the wait for the guest's quiescent point (`quiesce_us`).
- memory: N VMs (default 1,000) of `libbench touch` each map `bench.so`
  (1 MiB table, every page read by the guest); host memory is the sum of
  their VMM processes' proportional set sizes (PSS: a page shared by k
  processes counts 1/k in each) once every VM has answered (each answer
  comes once its guest touched the table: `wait_line`); the drop of
  MemAvailable over the same span is kept beside it (noisier: the host's
  page cache moves too). Against:
  N `libbench idle` VMs without the library (the VMs' own pages; measured
  first and again last, the smaller kept), and N
  `bigstatic` VMs with the same 1 MiB table linked into the image
  ("statically linked"). `shared_lib_mem_ratio` = shared / (own pages +
  one copy of the library's file); `static_vs_shared` = static / shared.

- starts (like bench/boot.py's warm path: the same C client,
  bench/tools/warmtime.c, on an open connection, from the request
  `POST /v1/vms?attach=true` to the first console line at the client; the
  daemon's pool of 16 MiB shells refilled before each run; each VM
  removed after its run, its boot trace read first): a warm boot of the
  `hello` image against hello.so run as an application by the `recycler`
  image (`wisp run --recycle`, printing as `hello` does), in recycling's
  three designs:
  - an endpoint (`recycle_ms`, the third design; what `wisp run
    --recycle` uses when the caller keeps an endpoint for the library):
    `POST /v1/recyclers` first, then the same request with the same body
    to the endpoint's socket, answered by the recycling group's VMM
    process on a recycler it keeps at its ready point, scrubbed after
    each run: the daemon is on no run's path;
  - kept (`recycle_kept_ms`, the second design): `"recycle": true` sends
    the run through wispd to a recycling group, where a recycler booted
    for an earlier run waits at its ready point, scrubbed;
  warm boots and the runs of these two alternate, START_REPS each (101; after 3 of
  each not counted: the first kept run boots its recycler);
  - booted per run (`recycle_booted_ms`, the first design): the same
    body without `recycle`: a pooled shell that holds the recycler loaded
    ahead boots it with the library mapped at its boot; START_REPS runs after
    the others (the pool's shells hold the image asked last: alternating
    with `hello` would have every run load its own).
  Per hop (the daemon's boot trace: arrived, sent, received by the VMM
  process, guest about to run, first output written): medians of each
  design's runs and of the warm boots. A VM's own fork (`wisp run family
  -- bench 200`, the guest's clock from its fork call to its return in
  the parent, as bench/snapshot.py measures it) is beside them: other
  start and stop points.

    python3 bench/libs.py --wisp target/release/wisp --out bench/results/libs.json
"""

import json
import os
import re
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import common  # noqa: E402
import wispapi  # noqa: E402

log = common.log
LIBS = os.path.join(ROOT, "build", "libs")
POOL = 4


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def lines(api, vm_id):
    """The VM's console, line by line, as it comes."""
    buf = b""
    for chunk in api.stream("/v1/vms/%s/logs?follow=true" % vm_id):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode(errors="replace")


def updates(d, reps):
    api, logs = d.api(), d.api()
    status, vm = api.call("POST", "/v1/vms?wait_line=true", {"image": "libbench", "args": ["update"], "libs": [os.path.join(LIBS, "bench.so")]})
    if status != 201:
        raise RuntimeError("libbench: %d %s" % (status, vm))
    console = lines(logs, vm["id"])
    next(line for line in console if line.startswith("libbench: version"))
    rows = []
    for i in range(reps):
        lib = "bench2.so" if i % 2 == 0 else "bench.so"
        t0 = wispapi.now_ns()
        status, r = api.call("POST", "/v1/vms/%s/update" % vm["id"], {"path": os.path.join(LIBS, lib), "replace": "bench"})
        t1 = wispapi.now_ns()
        if status != 200:
            raise RuntimeError("update %d: %d %s" % (i, status, r))
        line = next(line for line in console if line.startswith("libbench: version"))
        m = re.match(r"libbench: version (\d+) carried=(\w+) held_ns=(\d+)", line)
        if not m or m.group(2) != "all":
            raise RuntimeError("update %d: the guest says %r" % (i, line))
        rows.append({"update_ms": (t1 - t0) / 1e6, "daemon_ms": r["took_us"] / 1e3, "vmm_update_ms": r["update_us"] / 1e3, "held_us": r["held_us"],
                     "quiesce_us": r["quiesce_us"], "update_pause_us": int(m.group(3)) / 1e3, "variables": r["variables"]})
        time.sleep(0.02)
    api.call("DELETE", "/v1/vms/%s?force=true" % vm["id"])
    return rows


def pss(pid):
    """Proportional set size of process `pid` (bytes): its private pages,
    and each shared page divided among the processes mapping it."""
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def memory(d, n, body):
    """Host memory taken by N VMs of `body` (each answered once its first
    line is out): the sum of their VMM processes' PSS, and the drop of
    MemAvailable (bytes)."""
    api = d.api()
    d.wait_pool(api, POOL)
    time.sleep(1)
    before = meminfo("MemAvailable")
    for i in range(n):
        status, vm = api.call("POST", "/v1/vms?wait_line=true", body)
        if status != 201:
            raise RuntimeError("VM %d of %s: %d %s" % (i, body["image"], status, vm))
    d.wait_pool(api, POOL)
    time.sleep(1)
    taken = before - meminfo("MemAvailable")
    _, vms = api.call("GET", "/v1/vms")
    total = sum(pss(v["pid"]) for v in vms)
    secs, failed = d.remove_all()
    if failed:
        raise RuntimeError("%d VMs not removed" % failed)
    return total, taken


HOPS = ["arrived_ns", "sent_ns", "received_ns", "entered_ns", "first_output_ns"]


def starts(d, reps):
    """Warm boots of `hello` and starts of hello.so by the recycler (its
    two designs): ms from the request to the first console line at the
    client, and each run's hops (us from the request)."""
    import subprocess
    client = common.cc(os.path.join(common.TOOLS, "warmtime.c"), os.path.join(common.BUILD, "warmtime"))
    ctl = d.api()
    hello = os.path.join(LIBS, "hello.so")
    status, ep = ctl.call("POST", "/v1/recyclers", {"lib": hello})
    if status != 201:
        raise RuntimeError("recycler endpoint: %d %s" % (status, ep))
    bodies = {"warm_boot_ms": {"image": "hello", "args": ["a", "b"]},
              "recycle_ms": {"image": "recycler", "args": ["a", "b"], "libs": [hello], "recycle": True},
              "recycle_kept_ms": {"image": "recycler", "args": ["hello", "a", "b"], "libs": [hello], "recycle": True},
              "recycle_booted_ms": {"image": "recycler", "args": ["hello", "a", "b"], "libs": [hello]}}
    sockets = {"recycle_ms": ep["socket"]}
    out = {k: [] for k in bodies}
    hops = {k: {h: [] for h in HOPS + ["line_ns"]} for k in bodies}
    kept = []

    def one(k, counted):
        d.wait_pool(ctl, POOL)
        time.sleep(0.01)  # the previous VM's teardown done, as bench/boot.py's warm path waits
        r = subprocess.run([client, sockets.get(k, d.socket), json.dumps(bodies[k])], capture_output=True, text=True, timeout=30)
        f = r.stdout.split()
        if r.returncode != 0 or len(f) != 4:
            raise RuntimeError("warmtime %s: %s %s" % (k, r.stdout.strip(), r.stderr.strip()))
        vm = {}
        if f[3] != "-":  # (an endpoint's run is no VM of the toolstack)
            _, vm = ctl.call("GET", "/v1/vms/%s" % f[3])
            ctl.call("DELETE", "/v1/vms/%s?force=true" % f[3])
        if not counted:
            return
        start = int(f[0])
        out[k].append((int(f[1]) - start) / 1e6)
        t = vm.get("boot_trace") or {}
        for h in HOPS:
            if t.get(h):
                hops[k][h].append((t[h] - start) / 1e3)
        hops[k]["line_ns"].append((int(f[1]) - start) / 1e3)
        if k == "recycle_kept_ms":
            kept.append((bool(t.get("preloaded")), vm.get("group"), vm.get("boot_us")))

    # Warm boots and kept recyclers alternate (neither changes what the
    # pool's shells hold loaded ahead); then the first design's runs.
    for i in range(reps + 3):
        one("warm_boot_ms", i >= 3)
        one("recycle_ms", i >= 3)
        one("recycle_kept_ms", i >= 3)
    for i in range(reps + 3):
        one("recycle_booted_ms", i >= 3)
    ctl.call("DELETE", "/v1/recyclers/%s" % ep["id"])
    if not all(k[0] for k in kept):
        raise RuntimeError("a counted recycled run did not go on from a kept recycler: %s" % kept)
    hop = {k: {h.replace("_ns", "_us"): round(sorted(v)[len(v) // 2], 1) for h, v in hs.items() if v} for k, hs in hops.items()}
    return out, hop


def plot(doc, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    u = doc["update"]
    a.bar(["update (client)", "VMM process", "guest paused"],
          [u["update_ms"]["median"], u["vmm_update_ms"]["median"], u["update_pause_us"]["median"] / 1e3])
    a.axhline(5, color="r", ls="--", label="KylinX: 5 ms")
    a.set_ylabel("ms (median)")
    a.set_title("live update, 111 functions + 111 variables")
    a.legend()
    m = doc["memory"]
    b.bar(["own pages", "shared library", "statically linked"], [m["own_mib"], m["shared_mib"], m["static_mib"]])
    b.set_ylabel("MiB for %d VMs" % m["vms"])
    b.set_title("host memory, 1 MiB library")
    st = doc.get("starts")
    if st:
        c.bar(["warm boot\n(hello)", "recycled:\nendpoint", "recycled:\nkept, wispd", "recycled:\nbooted", "VM fork\n(guest clock)"],
              [st["warm_boot_ms"]["median"], st["recycle_ms"]["median"], st["recycle_kept_ms"]["median"], st["recycle_booted_ms"]["median"], doc["fork_ms"]["median"]])
        c.axhline(st["warm_boot_ms"]["median"] / 2, color="r", ls="--", label="target: 0.5x warm boot")
        c.legend(fontsize=7)
        c.tick_params(axis="x", labelsize=8)
        c.set_ylabel("ms (median)")
        c.set_title("start: request -> first line at the client")
    fig.suptitle(doc["machine"].get("cpu", ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main():
    def extra(ap):
        ap.add_argument("--wisp", default=os.path.join(ROOT, "target/release/wisp"))
        ap.add_argument("--reps", type=int, default=31)
        ap.add_argument("--start-reps", type=int, default=101)
        ap.add_argument("--vms", type=int, default=1000)
    args = common.bench_args(__doc__, os.path.join(ROOT, "bench/results/libs.json"), plot, extra)
    if args is None:
        return
    wispd = os.path.join(os.path.dirname(os.path.abspath(args.wisp)), "wispd")
    n = args.vms
    d = wispapi.Daemon(wispd, os.path.join(ROOT, "build", "images"), pool="16M=%d" % POOL,
                       extra=["--max-vms", str(n + 10), "--max-guest-memory", "%dM" % (16 * (n + 10))])
    try:
        start, hops = starts(d, args.start_reps)
        s = {k: common.summary(v) for k, v in start.items()}
        log("[libs] start: warm boot %.3f ms; recycled: at an endpoint %.3f ms, on a recycler kept via wispd %.3f ms, on a recycler booted per run %.3f ms" % (
            s["warm_boot_ms"]["median"], s["recycle_ms"]["median"], s["recycle_kept_ms"]["median"], s["recycle_booted_ms"]["median"]))
        log("[libs] hops (us from the request, medians): %s" % json.dumps(hops))
        rows = updates(d, args.reps)
        u = {k: common.summary([r[k] for r in rows]) for k in rows[0] if k != "variables"}
        log("[libs] update: %.3f ms (VMM %.3f ms), guest paused %.1f us (monitor %.1f us), %d variables" % (
            u["update_ms"]["median"], u["vmm_update_ms"]["median"], u["update_pause_us"]["median"], u["held_us"]["median"], rows[0]["variables"]))
        lib = os.path.join(LIBS, "bench.so")
        (own_first, own_avail) = memory(d, n, {"image": "libbench", "args": ["idle"]})
        (shared, shared_avail) = memory(d, n, {"image": "libbench", "args": ["touch"], "libs": [lib]})
        (static, static_avail) = memory(d, n, {"image": "bigstatic"})
        # The VMs' own pages again, last: the smaller of the two (the
        # ratio's denominator) is the stricter.
        (own_last, _) = memory(d, n, {"image": "libbench", "args": ["idle"]})
        own = min(own_first, own_last)
    finally:
        d.stop()
    import snapshot
    fork_ms = snapshot.vm_fork_ms(args.wisp, 7)
    copy = os.path.getsize(lib)
    mib = lambda b: round(b / 2**20, 1)  # noqa: E731
    mem = {"vms": n, "own_mib": mib(own), "own_first_last_mib": [mib(own_first), mib(own_last)], "shared_mib": mib(shared), "static_mib": mib(static), "library_bytes": copy,
           "shared_per_vm_kib": round((shared - own) / n / 1024, 2), "static_per_vm_kib": round((static - own) / n / 1024, 2),
           "memavailable_drop_mib": {"own": mib(own_avail), "shared": mib(shared_avail), "static": mib(static_avail)}}
    log("[libs] memory of %d VMs: own %.1f MiB, sharing the library %.1f MiB, statically linked %.1f MiB" % (n, mem["own_mib"], mem["shared_mib"], mem["static_mib"]))
    doc = {
        "what": "live update of a 111-function, 111-variable library in a running VM; host memory of VMs sharing a 1 MiB library",
        "method": __doc__.strip(),
        "reps": args.reps,
        "start_reps": args.start_reps,
        "update": u,
        "variables": rows[0]["variables"],
        "memory": mem,
        "starts": s,
        "start_hops_us": hops,
        "fork_ms": common.summary(fork_ms),
        "ratios": {
            "recycle_vs_warm_boot": round(s["recycle_ms"]["median"] / s["warm_boot_ms"]["median"], 3),
            "recycle_kept_vs_warm_boot": round(s["recycle_kept_ms"]["median"] / s["warm_boot_ms"]["median"], 3),
            "recycle_booted_vs_warm_boot": round(s["recycle_booted_ms"]["median"] / s["warm_boot_ms"]["median"], 3),
            "update_ms": u["update_ms"]["median"],
            "update_pause_us": u["update_pause_us"]["median"],
            "shared_lib_mem_ratio": round(shared / (own + copy), 4),
            "static_vs_shared": round(static / shared, 3),
        },
        "ratios_note": "update_ms: client clock, request to answer (sent once the guest switched; the old library is unmapped after); update_pause_us: the guest's"
                       " own clock around its library hypercall; shared_lib_mem_ratio: the memory of N VMs mapping the"
                       " library over their own pages plus one copy of it; recycle_vs_warm_boot: request to first line at the client, the same"
                       " client and request for both, sent to a recycler endpoint (recycling's third design: the recycling group's VMM"
                       " process answers on a recycler kept at its ready point; the daemon is on the warm boot's path, on no endpoint"
                       " run's); recycle_kept_vs_warm_boot: the same through wispd to a recycling group (the second design);"
                       " recycle_booted_vs_warm_boot: a recycler booted per run (the first design)",
        "targets": {"update_ms": 1, "update_pause_us": 100, "shared_lib_mem_ratio": 1.1, "recycle_vs_warm_boot": 0.5, "kylinx_update_ms": 5},
        "machine": common.machine_info(),
    }
    common.write_result(doc, args, plot, __file__)


if __name__ == "__main__":
    main()
