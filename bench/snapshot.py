#!/usr/bin/env python3
"""Snapshots (issue 16, item 4; LightVM Figures 12-13): save and restore
latency of a small VM as the number of running VMs grows, and a restore
against a warm boot. A private wispd (pool of 16 MiB shells) runs N idle
`sleeper` VMs in the background (N = 10, 100, 1000); the VM measured is a
`counter` (16 MiB, ~300 KiB touched). At each N, each measured REPS times,
client clock, median:

- save: `POST /v1/vms/{id}/snapshot` (the file in a tmpfs) until its
  answer, which comes once the file's last byte is written and sealed;
  also the time the VM was held (`held_us`);
- restore: `POST /v1/vms` with `restore` until the answer (201), which the
  VMM process sends at the restored guest's first exit;
- template: `POST /v1/vms` with `from` (a template of the same counter,
  saved where it says it is ready) until the answer, likewise;
- warm boot: `POST /v1/vms` of `counter` from the pool (the image loaded
  ahead) until the answer (201), which the VMM process sends at the
  guest's first exit: the same start and stop points;
- fork (beside the template start, issue 16 item 2): a VM forking itself,
  `wisp run family -- bench 200` in direct mode as bench/fork.py runs it:
  the guest's clock from its fork call until fork returns in the parent
  (the child VM exists and runs), mean of 200 per run, median of the runs.
  Not the same start and stop points as the template start (no API, no
  daemon, no answer): `template_vs_fork` says how far apart the two ways
  of getting a VM from a ready one are, not which path is slower;
- migrate: `POST /v1/vms/{id}/migrate` of a counter to a second daemon on
  this host over the loopback, until its answer (the VM runs there), and
  the downtime the source measured (its pause to the destination's
  answer); the N VMs run at the source.

Before each measurement the pools are full again (their prepare phase is
not what is measured, and no refill runs beside it) and the VMs started
are removed (N stays N).

    python3 bench/snapshot.py --wisp target/release/wisp --out bench/results/snapshot.json
"""

import os
import statistics
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import common  # noqa: E402
import wispapi  # noqa: E402

log = common.log
COUNTER = {"image": "counter", "args": ["1000000000", "50ms"]}
# Shells kept ready; each measurement waits until all are (no refill runs
# beside it).
POOL = 4


def ms(ns):
    return ns / 1e6


def timed(api, method, path, body, want):
    t0 = wispapi.now_ns()
    status, r = api.call(method, path, body)
    t1 = wispapi.now_ns()
    if status != want:
        raise RuntimeError("%s %s: %d %s" % (method, path, status, r))
    return ms(t1 - t0), r


def remove(api, vm_id):
    api.call("DELETE", "/v1/vms/%s?force=true" % vm_id)


def measure(d, api, snap_dir, reps):
    """Save, restore, a start from a template and a warm boot, REPS times
    each: lists of ms."""
    _, target = timed(api, "POST", "/v1/vms?wait_line=true", COUNTER, 201)
    save, held, restore, template, warm = [], [], [], [], []
    path = os.path.join(snap_dir, "counter.snap")
    for _ in range(reps):
        t, r = timed(api, "POST", "/v1/vms/%s/snapshot" % target["id"], {"path": path}, 201)
        save.append(t)
        held.append(r["held_us"] / 1e3)
    for _ in range(reps):
        d.wait_pool(api, POOL)
        t, vm = timed(api, "POST", "/v1/vms", {"image": "counter.snap", "restore": path}, 201)
        restore.append(t)
        remove(api, vm["id"])
    d.wait_pool(api, POOL)
    timed(api, "POST", "/v1/templates", dict(COUNTER, name="bench"), 201)
    for _ in range(reps):
        d.wait_pool(api, POOL)
        t, vm = timed(api, "POST", "/v1/vms", {"image": "bench", "from": "bench"}, 201)
        template.append(t)
        remove(api, vm["id"])
    for _ in range(reps):
        d.wait_pool(api, POOL)
        t, vm = timed(api, "POST", "/v1/vms", COUNTER, 201)
        warm.append(t)
        remove(api, vm["id"])
    remove(api, target["id"])
    return {"save_ms": save, "held_ms": held, "restore_ms": restore, "template_ms": template, "warm_boot_ms": warm,
            "snapshot_bytes": os.path.getsize(path)}


def vm_fork_ms(wisp, reps):
    """REPS runs of `wisp run family -- bench 200` (direct mode): the
    guest's mean fork time per run, ms."""
    import subprocess
    import fork as forkbench
    env = dict(os.environ, WISP_SOCKET="/nonexistent/no-daemon.sock")
    out = []
    for _ in range(reps):
        r = subprocess.run([wisp, "run", "--timeout", "300s", "family", "--", "bench", "200"], capture_output=True, text=True,
                           env=env, timeout=600)
        if r.returncode != 0:
            raise RuntimeError("family bench failed (%d): %s%s" % (r.returncode, r.stdout, r.stderr))
        out.append(forkbench.parse(r.stdout)["fork"] / 1e6)
    return out


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def migrations(d, api, dest, port, reps):
    """REPS migrations of a counter VM to the destination daemon over the
    loopback: client wall ms of `POST /v1/vms/{id}/migrate` until its
    answer (the VM runs there), and the downtime the source measured (its
    pause to the destination's answer)."""
    total, down = [], []
    dapi = dest.api()
    for _ in range(reps):
        _, vm = timed(api, "POST", "/v1/vms?wait_line=true", COUNTER, 201)
        # The VM's own start took a pooled shell: both pools full again
        # before the move (no refill runs beside it).
        d.wait_pool(api, POOL)
        dest.wait_pool(dapi, POOL)
        t, r = timed(api, "POST", "/v1/vms/%s/migrate" % vm["id"], {"to": "127.0.0.1:%d" % port}, 200)
        total.append(t)
        down.append(r["downtime_us"] / 1e3)
        remove(dapi, r["there"])
    return {"migrate_ms": total, "migrate_downtime_ms": down}


def plot(doc, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = doc["by_vms"]
    xs = [r["vms"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("save_ms", "save (API, file written)"), ("held_ms", "save: VM held"),
                       ("restore_ms", "restore (API, until the guest runs)"), ("template_ms", "start from a template (same)"),
                       ("warm_boot_ms", "warm boot (API, same stop point)"), ("migrate_ms", "migrate (API, until it runs there)"),
                       ("migrate_downtime_ms", "migration downtime")):
        ax.plot(xs, [r[key]["median"] for r in rows], "o-", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("VMs running")
    ax.set_ylabel("ms (median)")
    ax.set_title("wisp snapshots: 16 MiB counter VM")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    return True


def main():
    def extra(ap):
        ap.add_argument("--wisp", default=os.path.join(ROOT, "target/release/wisp"))
        ap.add_argument("--vms", default="10,100,1000")
        ap.add_argument("--reps", type=int, default=31)
        ap.add_argument("--migrations", type=int, default=15)
    args = common.bench_args(__doc__, os.path.join(ROOT, "bench/results/snapshot.json"), plot, extra)
    if args is None:
        return
    wispd = os.path.join(os.path.dirname(os.path.abspath(args.wisp)), "wispd")
    # Before any daemon runs (nothing beside it).
    fork_ms = vm_fork_ms(args.wisp, 7)
    log("[snapshot] a VM's own fork: %.3f ms (median of 7 runs' means)" % statistics.median(fork_ms))
    counts = [int(x) for x in args.vms.split(",")]
    top = max(counts)
    key = os.path.join(tempfile.mkdtemp(prefix="wisp-bench-key-"), "migrate.key")
    with open(key, "w") as f:
        f.write("a benchmark's migration key 0123456789")
    os.chmod(key, 0o600)
    port = free_port()
    d = wispapi.Daemon(wispd, os.path.join(ROOT, "build", "images"), pool="16M=%d" % POOL,
                       extra=["--max-vms", str(top + 10), "--max-guest-memory", "%dM" % (16 * (top + 10)), "--migrate-key", key])
    dest = wispapi.Daemon(wispd, os.path.join(ROOT, "build", "images"), pool="16M=%d" % POOL,
                          extra=["--migrate-key", key, "--migrate-listen", "127.0.0.1:%d" % port])
    api = d.api()
    snap_dir = tempfile.mkdtemp(prefix="wisp-bench-snap-", dir="/run" if os.access("/run", os.W_OK) else None)
    rows = []
    running = 0
    try:
        for n in counts:
            while running < n:
                status, vm = api.call("POST", "/v1/vms", {"image": "sleeper", "args": ["24h", "60s"]})
                if status != 201:
                    raise RuntimeError("sleeper %d: %d %s" % (running, status, vm))
                running += 1
            d.wait_pool(api, POOL)
            time.sleep(1)
            m = measure(d, api, snap_dir, args.reps)
            m.update(migrations(d, api, dest, port, args.migrations))
            row = {"vms": n, "snapshot_bytes": m.pop("snapshot_bytes")}
            row.update({k: common.summary(v) for k, v in m.items()})
            rows.append(row)
            log("[snapshot] %4d VMs: save %.2f ms (held %.2f), restore %.2f ms, template %.2f ms, warm boot %.2f ms, "
                "migrate %.2f ms (%.2f down)" % (
                    n, row["save_ms"]["median"], row["held_ms"]["median"], row["restore_ms"]["median"], row["template_ms"]["median"],
                    row["warm_boot_ms"]["median"], row["migrate_ms"]["median"], row["migrate_downtime_ms"]["median"]))
    finally:
        d.stop()
        dest.stop()
    worst = lambda k: max(r[k]["median"] for r in rows)  # noqa: E731
    doc = {
        "what": "save and restore latency of a 16 MiB VM as the VMs running grow; restore against a warm boot",
        "method": __doc__.strip(),
        "reps": args.reps,
        "by_vms": rows,
        "fork_ms": common.summary(fork_ms),
        "ratios": {
            "save_ms": worst("save_ms"),
            "restore_ms": worst("restore_ms"),
            "restore_vs_warm_boot": max(r["restore_ms"]["median"] / r["warm_boot_ms"]["median"] for r in rows),
            "template_vs_warm_boot": max(r["template_ms"]["median"] / r["warm_boot_ms"]["median"] for r in rows),
            "template_vs_fork": worst("template_ms") / statistics.median(fork_ms),
            "migrate_ms": worst("migrate_ms"),
            "migrate_downtime_ms": worst("migrate_downtime_ms"),
        },
        "ratios_note": "the worst median over the VM counts (N VMs run at the source of a migration); template_vs_fork:"
                       " an API start from a template (client clock, until the instance's first exit) over a VM's own fork"
                       " (guest clock, until fork returns in the parent): other start and stop points, the fork has no API"
                       " and no daemon in it",
        "targets": {"save_ms": 3, "restore_ms": 1, "migrate_ms": 10, "migrate_downtime_ms": 2,
                    "lightvm_save_ms": 30, "lightvm_restore_ms": 20, "lightvm_migrate_ms": 60},
        "machine": common.machine_info(),
    }
    common.write_result(doc, args, plot, __file__)


if __name__ == "__main__":
    main()
