#!/usr/bin/env python3
"""LightVM's use cases as services (issue 18), each side by side with its
obvious alternative on this host, in parts (`--parts`, default all); a
part run alone replaces its own results in the JSON and keeps the others'.

- kv (bench/usecases_kv.py): kvstore against redis-server, host process
  and namespace container, under redis-benchmark.
- jit (bench/usecases_jit.py): just-in-time VMs (a VM booted per new
  client) against socket activation (a process per connection), open-loop
  arrivals, first-response latency.
- fn (bench/usecases_fn.py): the functions service, a compute function on
  a VM per call against a process per call, one at a time and under
  LightVM's open-loop overload.
- fw (bench/usecases_fw.py): personal firewalls, 1,000 firewall VMs each
  on a client's path against nftables chains per client, throughput and
  a further client's ping as the active clients grow.
- tls (bench/usecases_tls.py): TLS termination, a tlsproxy VM per tenant
  against one host nginx for all tenants, handshakes/s and latency as the
  tenants grow.

    python3 bench/usecases.py --wisp target/release/wisp --out bench/results/usecases.json [--parts jit]
"""

import json
import os
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import common  # noqa: E402
import usecases_fn  # noqa: E402
import usecases_fw  # noqa: E402
import usecases_jit  # noqa: E402
import usecases_kv  # noqa: E402
import usecases_tls  # noqa: E402

PARTS = {"kv": usecases_kv, "jit": usecases_jit, "fn": usecases_fn, "fw": usecases_fw, "tls": usecases_tls}


def plot(doc, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    parts = [p for p in PARTS if p in doc.get("parts", {})]
    fig, axes = plt.subplots(len(parts), 2, figsize=(11, 4 * len(parts)), squeeze=False)
    for row, p in zip(axes, parts):
        PARTS[p].plot(row, doc["parts"][p])
    fig.suptitle(doc["machine"].get("cpu", ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    return True


def main():
    def extra(ap):
        ap.add_argument("--wisp", default=os.path.join(ROOT, "target/release/wisp"))
        ap.add_argument("--parts", default=",".join(PARTS), help="which parts to run: %s" % ",".join(PARTS))
        ap.add_argument("--requests", type=int, default=100000, help="kv: requests per redis-benchmark run")
        ap.add_argument("--rounds", type=int, default=5, help="kv: rounds")
        ap.add_argument("--clients", type=int, default=300, help="jit: arrivals per rate and peer")
        ap.add_argument("--calls", type=int, default=1000, help="fn: calls of the open loop")
        ap.add_argument("--digits", type=int, default=3000, help="fn: decimals of e each call computes")
        ap.add_argument("--fw-vms", type=int, default=1000, help="fw: firewall VMs (and clients)")
        ap.add_argument("--fw-seconds", type=float, default=5, help="fw: seconds of traffic per level and peer")
        ap.add_argument("--tls-tenants", default="1,2,4,8,16,32,64", help="tls: tenant counts, the last the headline")
        ap.add_argument("--tls-seconds", type=float, default=5, help="tls: seconds measured per level and peer")
    args = common.bench_args(__doc__, os.path.join(ROOT, "bench/results/usecases.json"), plot, extra)
    if args is None:
        return
    wanted = [p for p in args.parts.split(",") if p]
    unknown = [p for p in wanted if p not in PARTS]
    if unknown:
        raise SystemExit("unknown parts %s (known: %s)" % (unknown, ", ".join(PARTS)))
    os.makedirs(os.path.join(BENCH, "build"), exist_ok=True)  # (the servers' logs, the C peers)
    try:
        with open(args.out) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        doc = {}
    doc.setdefault("parts", {})
    doc.setdefault("part_ratios", {})
    doc.setdefault("part_notes", {})
    doc.setdefault("part_targets", {})
    for name in wanted:
        part, ratios, note, targets = PARTS[name].run(args)
        doc["parts"][name] = part
        doc["part_ratios"][name] = ratios
        doc["part_notes"][name] = note
        doc["part_targets"][name] = targets
    # Older results of the kv part (before parts): kept as that part's.
    for old in ("kv", "requests", "rounds", "method"):
        doc.pop(old, None)
    doc["what"] = "LightVM's use cases as services (issue 18), each against its obvious alternative on this host"
    doc["method"] = __doc__.strip()
    doc["ratios"] = {k: v for p in PARTS for k, v in doc["part_ratios"].get(p, {}).items()}
    doc["ratios_note"] = " ".join(doc["part_notes"].get(p, "") for p in PARTS if p in doc["part_notes"])
    doc["targets"] = {k: v for p in PARTS for k, v in doc["part_targets"].get(p, {}).items()}
    doc["machine"] = common.machine_info()
    common.write_result(doc, args, plot, __file__)


if __name__ == "__main__":
    main()
