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
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (BENCH, BUILD, ROOT, Context, Skip, _read, fmt, log, machine_info,  # noqa: E402
                    median, summary, with_system_python)
from boot_peers import PEERS  # noqa: E402


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


RATIOS = {  # JSON key -> (wisp peer, peer it is compared with)
    "warm_boot_vs_forkexec": ("wisp_warm", "forkexec"),
    # Like with like: both stop at the first line of output.
    "warm_boot_vs_forkexec_first_line": ("wisp_warm", "forkexec_first_line"),
    "api_cold_boot_vs_forkexec": ("wisp_api_cold", "forkexec"),
    "cold_boot_vs_forkexec": "forkexec",
    # The VM destroyed before `wisp run` exits, instead of by a detached child.
    "cold_boot_sync_vs_forkexec": ("wisp_sync_teardown", "forkexec"),
    "cold_boot_vs_container": "container_unshare",
    "cold_boot_vs_crun": "container_crun",
    "cold_boot_vs_linux_vm": "linux_vm",
}


# --------------------------------------------------------------------------
# main


def print_table(results, wisp_median):
    rows = [("peer", "runs", "median ms", "min", "max", "p99", "wisp/peer")]
    for name, res in results.items():
        if "skipped" in res:
            rows.append((PLOT_LABELS.get(name, name), "-", "skipped: " + (res["skipped"].splitlines() or [""])[0],
                         "", "", "", ""))
            continue
        ratio = wisp_median / res["median"] if wisp_median and res.get("median") else None
        rows.append((PLOT_LABELS.get(name, name), str(res["runs"]), fmt(res["median"]), fmt(res["min"]), fmt(res["max"]),
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


# Beside every figure of the Linux-VM peer: on this host it runs under QEMU TCG (software emulation).
PLOT_LABELS = {"linux_vm": "linux_vm (QEMU TCG)"}
NOTE = ("wisp median / peer median (below 1 means wisp is faster); the Linux VM of cold_boot_vs_linux_vm runs "
        "under QEMU TCG (software emulation: KVM on this host cannot boot a stock Linux kernel)")


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
    ax.barh([PLOT_LABELS.get(n, n) for n in names], med, xerr=[lo, hi], color="#4a7ebb", capsize=3)
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
        "ratios_note": NOTE,
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


if __name__ == "__main__":
    sys.exit(main())
