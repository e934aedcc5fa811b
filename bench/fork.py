#!/usr/bin/env python3
"""Fork and family IPC benchmark (KylinX Table 3, side by side in one run).

    python3 bench/fork.py --wisp target/release/wisp --out bench/results/fork.json

Two peers make the same measurements with the same method and print them in
the same format ("bench NAME NS", mean ns per operation or round trip over
ROUNDS):
  wisp  `wisp run family -- bench ROUNDS`: a VM and its forked child VM
        (guest/apps/family, the `bench` mode), direct mode
  unix  bench/tools/ipcbench.c: a process and its forked child
Measurements: fork (until fork returns in the parent), fork_exit_wait
(fork, the child exits at once, the parent waits), and round trips between
parent and child over a pipe, a message queue, shared memory (spinning on a
word) and signals (kill one way, kill back). The peers alternate, REPS times
each; the JSON keeps every repetition and reports the median.
"""

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import common  # noqa: E402  (shared helpers: C builds, machine description)

METRICS = ["fork", "fork_exit_wait", "pipe", "msgq", "shm", "kill"]
RATIOS = {"fork_vs_process_fork": "fork", "pipe_vs_unix": "pipe", "msgq_vs_unix": "msgq",
          "kill_vs_unix": "kill", "wait_vs_unix": "fork_exit_wait", "shm_vs_unix": "shm"}


LABELS = {"fork": "fork", "fork_exit_wait": "fork+exit+wait", "pipe": "pipe RTT", "msgq": "msgq RTT",
          "kill": "kill RTT", "shm": "shm RTT"}


def plot(doc, png):
    """Grouped bars, wisp VMs vs UNIX processes (log scale). False without
    matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    w, u = doc["peers"]["wisp"]["median_ns"], doc["peers"]["unix"]["median_ns"]
    xs = range(len(METRICS))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar([x - 0.2 for x in xs], [w[k] / 1e3 for k in METRICS], 0.4, label="wisp VMs (parent/child)", color="tab:red")
    ax.bar([x + 0.2 for x in xs], [u[k] / 1e3 for k in METRICS], 0.4, label="UNIX processes", color="tab:blue")
    ax.set_xticks(list(xs), [LABELS[k] for k in METRICS])
    ax.set_yscale("log")
    ax.set_ylabel("µs (median of the repetitions' means)")
    ax.set_title("fork and family IPC, %s" % doc["machine"].get("cpu_model", ""), fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return True


def parse(out):
    vals = dict((m.group(1), int(m.group(2))) for m in re.finditer(r"^bench (\w+) (\d+)$", out, re.M))
    missing = [k for k in METRICS if k not in vals]
    if missing:
        raise RuntimeError("missing %s in output:\n%s" % (missing, out))
    return vals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wisp", default=os.path.join(common.ROOT, "target/release/wisp"))
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "fork.json"))
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--plot-only", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.plot_only:
        with open(a.plot_only) as f:
            return 0 if plot(json.load(f), a.plot_only[:-len(".json")] + ".png") else 1
    os.makedirs(common.BUILD, exist_ok=True)
    unix = common.cc(os.path.join(common.TOOLS, "ipcbench.c"), os.path.join(common.BUILD, "ipcbench"))
    env = dict(os.environ, WISP_SOCKET="/nonexistent/no-daemon.sock")
    cmds = {"wisp": [a.wisp, "run", "--timeout", "300s", "family", "--", "bench", str(a.rounds)],
            "unix": [unix, str(a.rounds)]}
    runs = {k: [] for k in cmds}
    for rep in range(a.reps):
        for peer, cmd in cmds.items():
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
            if r.returncode != 0:
                raise SystemExit("%s failed (%d):\n%s%s" % (peer, r.returncode, r.stdout, r.stderr))
            runs[peer].append(parse(r.stdout))
            common.log("rep %d %s: %s" % (rep + 1, peer, runs[peer][-1]))
    med = {p: {k: statistics.median(x[k] for x in v) for k in METRICS} for p, v in runs.items()}
    doc = {
        "benchmark": "fork",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "machine": common.machine_info(),
        "rounds": a.rounds,
        "reps": a.reps,
        "unit": "ns per operation (fork) or per round trip, median of the repetitions' means",
        "peers": {p: {"median_ns": med[p], "runs": runs[p]} for p in runs},
        "ratios": {r: round(med["wisp"][k] / med["unix"][k], 3) for r, k in RATIOS.items()},
        "targets": {"fork_vs_process_fork": 1.5, "ipc_vs_unix": 1.0},
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    png = a.out[:-len(".json")] + ".png"
    if plot(doc, png) or common.with_system_python(__file__, "--plot-only", a.out):
        common.log("wrote %s" % png)
    else:
        common.log("no plot: matplotlib is not importable (python3-matplotlib)")
    print(json.dumps(doc["ratios"], indent=2))


if __name__ == "__main__":
    sys.exit(main())
