#!/usr/bin/env python3
"""CDNSim's speed and size (issue 15, item 7), and the boot-time sweep
its results are for. On a 1,000-AS graph of the generator (seed 1),
boot time 1 s: `cdnsim run` for 10,000, 100,000 and 1,000,000 viewers
(wall time, peak memory from `/usr/bin/time -v`, events/s), and for
100,000 and 1,000,000 with `--cooperative`; the same
10,000 viewers with `--naive` — the straightforward implementation of
the same model: a solver entry per stream and per feed, every rate
filled from scratch after every event and told at once — for the
speed-up (wall time of the same run); and `cdnsim sweep` of 100,000
viewers over boot times 0, 0.1, 0.5, 1 and 10 s plus the one wisp
measured (`bench/results/cache.json`), whose start-up CDFs cdnsim draws
itself (`cdnsim-sweep-cdf.png`). The Python CDNSim of the paper
cannot run here (Python 2, not published with its data).

    python3 bench/cdnsim.py --cdnsim target/release/cdnsim --out bench/results/cdnsim.json
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import common  # noqa: E402

log = common.log


def timed(argv):
    """Run `argv` under /usr/bin/time -v: (peak RSS in MB, its stdout)."""
    r = subprocess.run(["/usr/bin/time", "-v"] + argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("%s failed: %s" % (argv, r.stderr[-2000:]))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)) / 1024
    return rss, r.stdout


def run(cdnsim, topo, work, viewers, mode=None):
    out = os.path.join(work, "run-%d%s" % (viewers, "-" + mode if mode else ""))
    argv = [cdnsim, "run", "--topology", topo, "--viewers", str(viewers), "--boot-time", "1", "--out", out]
    rss, _ = timed(argv + (["--" + mode] if mode else []))
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    row = {"viewers": viewers, "wall_s": s["wall_s"], "peak_rss_mb": round(rss, 1), "events": s["events"],
           "events_per_s": s["events_per_s"], "peak_viewers": s["peak_viewers"], "peak_caches": s["peak_caches"],
           "startup_delay_s_mean": s["startup_delay_s"]["mean"], "feeds_from_caches": s["feeds_from_caches"]}
    log("[cdnsim] %s%d viewers: %.2f s, %.0f MB, %.0f events/s" % (mode + ", " if mode else "", viewers, row["wall_s"], rss, row["events_per_s"]))
    return row


def plot(doc, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs = sorted(doc["sweep"]["runs"], key=lambda r: r["boot_time_s"])
    xs = [max(r["boot_time_s"], 0.001) for r in runs]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    ax[0].plot(xs, [r["startup_delay_s"]["mean"] for r in runs], "o-", label="mean")
    ax[0].plot(xs, [r["startup_delay_s"]["p90"] for r in runs], "s--", label="p90")
    ax[1].plot(xs, [r["buffering_ratio"]["mean"] for r in runs], "o-")
    for a, t in zip(ax, ["start-up delay (s)", "buffering ratio (mean)"]):
        a.set_xscale("log")
        a.set_xlabel("cache boot time (s; 0 drawn at 1 ms)")
        a.set_title(t)
        w = doc["sweep"].get("wisp_boot_time_s")
        if w:
            a.axvline(w, color="green", linestyle=":", label="wisp cache VM (first byte after wisp run)")
    ax[0].legend(fontsize=8)
    fig.suptitle("CDNSim: %d viewers, 1,000 ASes" % doc["sweep"]["viewers"])
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    return True


def main():
    args = common.bench_args(__doc__, os.path.join(ROOT, "bench/results/cdnsim.json"), plot,
                             lambda ap: ap.add_argument("--cdnsim", default=os.path.join(ROOT, "target/release/cdnsim")))
    if args is None:
        return
    cdnsim = os.path.abspath(args.cdnsim)
    work = tempfile.mkdtemp(prefix="wisp-bench-cdnsim-")
    topo = os.path.join(work, "as1000.txt")
    subprocess.run([cdnsim, "gen-topology", "--ases", "1000", "--seed", "1", "--out", topo], check=True, capture_output=True)
    runs = [run(cdnsim, topo, work, n) for n in (10_000, 100_000, 1_000_000)]
    cooperative = [run(cdnsim, topo, work, n, "cooperative") for n in (100_000, 1_000_000)]
    naive = run(cdnsim, topo, work, 10_000, "naive")
    sweep_dir = os.path.join(work, "sweep")
    subprocess.run([cdnsim, "sweep", "--topology", topo, "--viewers", "100000", "--wisp-result",
                    os.path.join(ROOT, "bench/results/cache.json"), "--out", sweep_dir], check=True, capture_output=True)
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        sweep = json.load(f)
    for r in sweep["runs"]:
        log("[cdnsim] boot %.4f s: start-up %.3f s mean, %.3f p90; buffering %.5f" % (
            r["boot_time_s"], r["startup_delay_s"]["mean"], r["startup_delay_s"]["p90"], r["buffering_ratio"]["mean"]))
    doc = {
        "what": "CDNSim's wall time, peak memory and events/s by viewers; the straightforward implementation for the speed-up; the boot-time sweep",
        "method": __doc__.strip(),
        "topology": "cdnsim gen-topology --ases 1000 --seed 1",
        "runs": runs,
        "cooperative_runs": cooperative,
        "naive": naive,
        "sweep": sweep,
        "ratios": {
            "speedup_vs_naive": naive["wall_s"] / runs[0]["wall_s"],
            "events_per_s_vs_naive": runs[0]["events_per_s"] / naive["events_per_s"],
        },
        "targets": {"wall_s_1m": 600, "peak_rss_mb_1m": 4096, "moonshot_wall_s_1m": 120},
        "machine": common.machine_info(),
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    common.draw(plot, doc, args.png, __file__, args.out)
    # cdnsim's own plot of the sweep: start-up delay's CDF per boot time.
    shutil.copy(os.path.join(sweep_dir, "sweep.png"), os.path.join(os.path.dirname(args.out), "cdnsim-sweep-cdf.png"))
    log(json.dumps(doc["ratios"], indent=1))


if __name__ == "__main__":
    main()
