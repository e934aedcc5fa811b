#!/usr/bin/env python3
"""wisp as an OCI runtime under podman (issue 19, item 7): `podman run --rm`
of a no-op, start to exit, with wisp-oci as podman's runtime against runc
(podman's default here) and crun (where it runs: under podman on this
host's hybrid cgroup layout it refuses, and the table says so).

Like with like: one OCI image holds both no-ops — `/wisp/image` (the `noop`
wisp image: boots and exits 0) and `/noop` (bench/tools/noop.c, static:
exits 0) — so every peer gets the same podman command, the same image,
the same storage and the same network setup; only `--runtime` and the
entrypoint differ (`/noop` for the container runtimes). The client clock
runs from spawning `podman run` to its exit (podman's own work — image
lookup, storage, conmon, the network namespace and its teardown — is in
every figure). Two rows: podman's default network (a namespace with a
veth on podman's bridge; wisp-oci then plumbs it to the VM only if the
image wants a NIC: `noop` does not) and `--network none`. Runs alternate
between the peers (round robin), after WARMUP unmeasured runs each.
`podman_run_vs_runc` = wisp-oci's median / runc's (default network).

    python3 bench/oci.py --runtime target/release/wisp-oci --out bench/results/oci.json
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import common  # noqa: E402

log = common.log
IMAGE = "localhost/wisp-oci-bench-noop:1"
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
WARMUP = 3


def add_args(ap):
    ap.add_argument("--runtime", default=os.path.join(ROOT, "target/release/wisp-oci"))
    ap.add_argument("--runs", type=int, default=40, help="measured runs per peer and row")


def build_image():
    """The OCI image holding both no-ops (imported into podman's store)."""
    os.makedirs(common.BUILD, exist_ok=True)
    noop = common.cc(os.path.join(BENCH, "tools", "noop.c"), os.path.join(common.BUILD, "noop-static"), static=True)
    wisp_noop = os.path.join(ROOT, "build", "images", "noop")
    if not os.path.exists(wisp_noop):
        raise SystemExit("build/images/noop missing: run `make guest`")
    tar = os.path.join(common.BUILD, "oci-noop.tar")
    with tarfile.open(tar, "w") as t:
        t.add(wisp_noop, arcname="wisp/image")
        t.add(noop, arcname="noop")
    r = subprocess.run(["podman", "import", "--change", 'ENTRYPOINT ["/wisp/image"]', tar, IMAGE], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("podman import: " + r.stderr)


def argv(runtime, network):
    a = ["podman", "--runtime", runtime, "run", "--rm", "--pull=never"] + ULIMITS
    if network:
        a += ["--network", network]
    if os.path.basename(runtime) != "wisp-oci":
        a += ["--entrypoint", "/noop"]
    return a + [IMAGE]


def once(cmd):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = (time.perf_counter() - t) * 1e3
    if r.returncode != 0:
        raise common.Skip(("exit %d: " % r.returncode) + (r.stderr.strip().splitlines() or [""])[-1][:300])
    return dt


def plot(doc, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = doc["rows"]
    peers = [p for p in doc["peer_names"] if any(rows[r]["peers"].get(p, {}).get("median_ms") for r in rows)]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(peers))
    colors = {"wisp-oci": "tab:red", "runc": "tab:blue", "crun": "tab:green"}
    for i, p in enumerate(peers):
        xs = [j + (i - (len(peers) - 1) / 2) * width for j in range(len(rows))]
        ys = [rows[r]["peers"].get(p, {}).get("median_ms") or 0 for r in rows]
        ax.bar(xs, ys, width, label=p, color=colors.get(p))
    ax.set_xticks(range(len(rows)), [rows[r]["label"] for r in rows])
    ax.set_ylabel("ms, podman run --rm start to exit (median)")
    ax.set_title("podman run of a no-op, by OCI runtime — %s" % doc["machine"].get("cpu_model", ""), fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return True


def main():
    args = common.bench_args(__doc__, os.path.join(BENCH, "results", "oci.json"), plot, add_args)
    if args is None:
        return
    for tool in ("podman", "runc"):
        if not shutil.which(tool):
            raise SystemExit("%s missing: scripts/install-deps.sh installs it" % tool)
    build_image()
    try:
        measure(args)
    finally:
        subprocess.run(["podman", "rmi", "-f", IMAGE], capture_output=True)


def measure(args):
    runtimes = {"wisp-oci": os.path.abspath(args.runtime), "runc": shutil.which("runc")}
    if shutil.which("crun"):
        runtimes["crun"] = shutil.which("crun")
    rows = {"default": ("podman's default network", None), "none": ("--network none", "none")}
    doc = {
        "what": "podman run --rm of a no-op, start to exit (client clock around the podman command), by OCI runtime",
        "method": __doc__,
        "machine": common.machine_info(),
        "podman": subprocess.run(["podman", "--version"], capture_output=True, text=True).stdout.strip(),
        "runc": subprocess.run(["runc", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        "peer_names": list(runtimes),
        "rows": {},
    }
    for row, (label, network) in rows.items():
        times = {p: [] for p in runtimes}
        skipped = {}
        for p, rt in runtimes.items():
            try:
                for _ in range(WARMUP):
                    once(argv(rt, network))
            except common.Skip as e:
                skipped[p] = str(e)
                log("%s (%s): skipped: %s" % (p, label, e))
        live = [p for p in runtimes if p not in skipped]
        for i in range(args.runs):
            for p in list(live):
                try:
                    times[p].append(once(argv(runtimes[p], network)))
                except common.Skip as e:
                    # A peer that fails mid-run is dropped from the row, said.
                    skipped[p] = "run %d: %s" % (i, e)
                    live.remove(p)
                    times[p] = []
        out = {"label": label, "peers": {}}
        for p in runtimes:
            if p in skipped:
                out["peers"][p] = {"skipped": skipped[p]}
                continue
            s = sorted(times[p])
            out["peers"][p] = {"median_ms": round(common.median(s), 2), "p90_ms": round(common.percentile(s, 90), 2),
                               "min_ms": round(s[0], 2), "max_ms": round(s[-1], 2), "runs": len(s)}
            log("%-9s %-26s median %7.1f ms (min %.1f, p90 %.1f)" % (p, label, out["peers"][p]["median_ms"], s[0], out["peers"][p]["p90_ms"]))
        doc["rows"][row] = out
    med = lambda r, p: doc["rows"][r]["peers"].get(p, {}).get("median_ms")  # noqa: E731
    ratio = lambda r, peer: round(med(r, "wisp-oci") / med(r, peer), 3) if med(r, "wisp-oci") and med(r, peer) else None  # noqa: E731
    ratios = {
        "podman_run_vs_runc": ratio("default", "runc"),
        "podman_run_vs_runc_network_none": ratio("none", "runc"),
    }
    if ratio("default", "crun"):
        ratios["podman_run_vs_crun"] = ratio("default", "crun")
    doc["ratios"] = ratios
    doc["targets"] = {"podman_run_vs_runc": "<= 1.0"}
    common.write_result(doc, args, plot, __file__)


if __name__ == "__main__":
    main()
