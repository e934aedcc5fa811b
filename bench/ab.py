#!/usr/bin/env python3
"""A/B check of two builds of wisp on this machine, side by side in one run:
the boot benchmark's wisp peers (with fork+exec as the noise reference) and
the fork/IPC benchmark, alternating before/after for several rounds, each
tree running its own bench scripts and binaries. Used to show that a change
(e.g. a refactor) leaves the speed where it was.

  python3 bench/ab.py --before /path/to/old/checkout [--after .] [--rounds 2]

Both checkouts must be built (`make all`; the old one may use its own
CARGO_TARGET_DIR inside it). Writes bench/results/ab.json: per round and
build the medians, and per figure the median over rounds and after/before.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BOOT_PEERS = "wisp,wisp_warm,wisp_api_cold,forkexec"


def git(tree, *args):
    return subprocess.run(["git", "-C", tree, *args], capture_output=True, text=True).stdout.strip()


def run_tree(tree, script, out, extra):
    """Run `tree`'s own bench script against `tree`'s binaries."""
    wisp = os.path.join(tree, "target", "release", "wisp")
    cmd = [sys.executable, os.path.join(tree, "bench", script), "--wisp", wisp, "--out", out, *extra]
    common.log("%s: %s" % (tree, " ".join(cmd[1:])))
    with open(out + ".log", "w") as log:
        subprocess.run(cmd, cwd=tree, stdout=log, stderr=subprocess.STDOUT, check=True)
    with open(out) as f:
        return json.load(f)


def figures(boot, fork):
    """The figures compared: boot medians (ms) and fork/IPC medians (µs)."""
    f = {"boot.%s_ms" % k: v["median"] for k, v in boot["peers"].items() if "median" in v}
    for peer, v in fork["peers"].items():
        for op, ns in v.get("median_ns", {}).items():
            f["fork.%s.%s_us" % (peer, op)] = ns / 1000.0
    return f


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="checkout of the old code (built)")
    ap.add_argument("--after", default=common.ROOT, help="checkout of the new code (default: this one)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(common.BENCH, "results", "ab.json"))
    ap.add_argument("--scratch", default="/tmp/wisp-ab")
    a = ap.parse_args()
    os.makedirs(a.scratch, exist_ok=True)
    trees = {"before": os.path.abspath(a.before), "after": os.path.abspath(a.after)}
    rounds = []
    for r in range(a.rounds):
        got = {}
        for which, tree in trees.items():
            boot = run_tree(tree, "boot.py", os.path.join(a.scratch, "boot-%s-%d.json" % (which, r)), ["--peers", BOOT_PEERS])
            fork = run_tree(tree, "fork.py", os.path.join(a.scratch, "fork-%s-%d.json" % (which, r)), [])
            got[which] = figures(boot, fork)
        rounds.append(got)
    keys = sorted(set(rounds[0]["before"]) & set(rounds[0]["after"]))
    summary = {}
    for k in keys:
        b = statistics.median(x["before"][k] for x in rounds)
        af = statistics.median(x["after"][k] for x in rounds)
        summary[k] = {"before": round(b, 3), "after": round(af, 3), "after_vs_before": round(af / b, 3) if b else None}
    doc = {
        "benchmark": "ab",
        "what": "the same benchmarks on two builds, alternating before/after in one run; medians per round, then the median over rounds",
        "machine": common.machine_info(),
        "before": {"tree": trees["before"], "commit": git(trees["before"], "rev-parse", "--short", "HEAD")},
        "after": {"tree": trees["after"], "commit": git(trees["after"], "rev-parse", "--short", "HEAD"),
                  "dirty": bool(git(trees["after"], "status", "--porcelain", "--untracked-files=no"))},
        "rounds": rounds,
        "summary": summary,
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    for k in keys:
        s = summary[k]
        print("%-36s before %10.3f  after %10.3f  after/before %.3f" % (k, s["before"], s["after"], s["after_vs_before"]))
    common.log("wrote %s" % a.out)


if __name__ == "__main__":
    main()
