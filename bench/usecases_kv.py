"""Item 5 of issue 18, the key-value service: `kvstore` (a wisp VM
speaking Redis' protocol, on a tap in a network namespace this script
makes) against `redis-server` (Debian's, no persistence: `--save ''
--appendonly no`) as a host process on loopback and in a namespace
container (its own network namespace, reached over a veth pair). The same
client for all three, `redis-benchmark` (Debian's), in the same namespace:
GET and SET, 50 clients, not pipelined (N requests) and pipelined 16 deep
(16 N), ROUNDS rounds with the peers taking turns, medians of requests per
second. Each server is one thread (redis-server's default; the VM has one
vCPU). What differs is the path: loopback for the host process, a veth for
the container, a tap and the VM's exits for wisp. Run by bench/usecases.py."""

import csv
import io
import os
import shutil
import time

import common
from net import Net  # bench/net.py's namespaces: the client's with the VM's tap, the container's over a veth

log = common.log
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = 6380
TESTS = "get,set"


def wait_ready(ns, host, deadline_s=20):
    """Until the server at `host` answers PING (redis-cli from the client's
    namespace)."""
    end = time.time() + deadline_s
    while time.time() < end:
        r = ns.x("redis-cli", "-h", host, "-p", str(PORT), "PING", check=False)
        if r.stdout.strip() == "PONG":
            return
        time.sleep(0.05)
    raise RuntimeError("no PONG from %s" % host)


def benchmark(ns, host, n, pipeline):
    """redis-benchmark against `host`: requests per second by test."""
    r = ns.x("timeout", "300", "redis-benchmark", "-h", host, "-p", str(PORT), "-n", str(n), "-c", "50", "-P", str(pipeline),
             "-t", TESTS, "--csv", check=False)
    if r.returncode != 0:
        raise RuntimeError("redis-benchmark %s: %s %s" % (host, r.stdout[-300:], r.stderr[-300:]))
    out = {}
    for row in csv.reader(io.StringIO(r.stdout)):
        if len(row) >= 2 and row[0] != "test":
            out[row[0].split()[0].lower()] = float(row[1])
    return out


def run(args):
    """The kv part: its results and ratios."""
    for tool in ("redis-server", "redis-benchmark", "redis-cli"):
        if not shutil.which(tool):
            raise common.Skip("%s not found (scripts/install-bench-deps.sh)" % tool)
    ns = Net()
    ns.up()
    try:
        env = dict(os.environ, WISP_SOCKET="/nonexistent/wisp-bench.sock", WISP_IMAGE_DIR=os.path.join(ROOT, "build", "images"))
        redis = ["redis-server", "--port", str(PORT), "--save", "", "--appendonly", "no", "--protected-mode", "no"]
        servers = {
            "wisp": (ns.spawn([os.path.abspath(args.wisp), "run", "--timeout", "1800s", "--tap", "wtap0", "--ip", "10.88.0.2/24", "kvstore", "--", str(PORT)], "kv-wisp", env=env), "10.88.0.2"),
            "native": (ns.spawn(redis + ["--bind", "127.0.0.1"], "kv-native"), "127.0.0.1"),
            "container": (ns.spawn(redis + ["--bind", "10.88.2.2"], "kv-container", ns=ns.ns2), "10.88.2.2"),
        }
        for name, (_, host) in servers.items():
            wait_ready(ns, host)
        rows = {p: {"P1": {"get": [], "set": []}, "P16": {"get": [], "set": []}} for p in servers}
        for r in range(args.rounds):
            for name, (_, host) in servers.items():
                for depth in (1, 16):
                    got = benchmark(ns, host, args.requests * depth, depth)
                    for t in ("get", "set"):
                        rows[name]["P%d" % depth][t].append(got[t])
            log("[usecases] kv round %d: %s" % (r + 1, {p: {d: {t: round(v[-1]) for t, v in ts.items()} for d, ts in x.items()} for p, x in rows.items()}))
    finally:
        ns.down()
    kv = {p: {d: {t: common.summary(v, 1) for t, v in ts.items()} for d, ts in x.items()} for p, x in rows.items()}
    med = lambda p, d, t: kv[p][d][t]["median"]  # noqa: E731
    ratios = {
        "kv_get_vs_redis_native": round(med("wisp", "P1", "get") / med("native", "P1", "get"), 3),
        "kv_set_vs_redis_native": round(med("wisp", "P1", "set") / med("native", "P1", "set"), 3),
        "kv_get_pipelined_vs_redis_native": round(med("wisp", "P16", "get") / med("native", "P16", "get"), 3),
        "kv_get_vs_redis_container": round(med("wisp", "P1", "get") / med("container", "P1", "get"), 3),
        "kv_get_pipelined_vs_redis_container": round(med("wisp", "P16", "get") / med("container", "P16", "get"), 3),
    }
    note = ("kv_*: requests per second of kvstore (a wisp VM on a tap) over redis-server's on loopback (native) or over a veth"
            " (container); the same redis-benchmark, 50 clients, medians of the rounds; above 1: wisp serves more")
    part = {"method": __doc__.strip(), "requests": args.requests, "rounds": args.rounds, "peers": kv}
    return part, ratios, note, {"kv_get_vs_redis_native": 1.0}


def plot(ax_pair, part):
    """Requests per second by peer, plain and pipelined (two axes)."""
    kv = part["peers"]
    peers = ["wisp", "container", "native"]
    names = {"wisp": "kvstore (wisp VM)", "container": "redis-server\n(container)", "native": "redis-server\n(host process)"}
    for ax, depth in zip(ax_pair, ["1", "16"]):
        width = 0.35
        for i, t in enumerate(["get", "set"]):
            vals = [kv[p]["P%s" % depth][t]["median"] / 1e3 for p in peers]
            ax.bar([x + i * width for x in range(len(peers))], vals, width, label=t.upper())
        ax.set_xticks([x + width / 2 for x in range(len(peers))])
        ax.set_xticklabels([names[p] for p in peers], fontsize=8)
        ax.set_ylabel("thousand requests/s (median)")
        ax.set_title("kv: redis-benchmark, 50 clients, pipeline %s" % depth, fontsize=9)
        ax.legend()
