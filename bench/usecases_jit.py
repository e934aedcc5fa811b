"""Item 1 of issue 18, just-in-time VMs (LightVM §7.1, Figure 16b):
open-loop arrivals of new clients, one every 25 ms and one every 10 ms,
each from an address of its own (127.x.y.z: every arrival is a client the
server has not seen), each connecting to a daytime service and reading its
one line. Measured: from the client's connect to the first byte of the
answer, as a CDF and its median.

Peers, one after the other at each rate, the same client:
- `jit`: `wisp jit add` of the `daytime` image under a wispd with groups
  (`--vms-per-process 64`): each new client's connection boots its VM;
  VMs idle for IDLE ms are removed, as the run goes on.
- `jit_process`: the same under a wispd with a VMM process per VM (the
  pool of prepared shells, refilled as VMs are taken): the first design.
- `socket_activated`: systemd's socket activation with a process per
  connection (`systemd-socket-activate --accept --inetd`, inetd's `nowait`)
  of a static C daytime (bench/tools/daytime.c) that writes the same line
  and exits: fork and exec per client, no VM.

All on loopback (the daemons' bridges are theirs), on this host's two
CPUs with the client. Run by bench/usecases.py."""

import os
import shutil
import subprocess
import time

import common
import wispapi

log = common.log
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = 8213
RATES_MS = (25, 10)
IDLE_MS = 1000


def arrivals(port, gap_ms, n, net):
    """n clients, one every gap_ms (open loop: each at its time whatever
    the others do), client i from 127.<net>.<i/250+1>.<i%250+1>; each
    connection's connect-to-first-byte in ms, None where it failed."""
    import socket
    out = [None] * n
    why = {}

    def one(i):
        s = socket.socket()
        s.settimeout(10)
        try:
            s.bind(("127.%d.%d.%d" % (net, 1 + i // 250, 1 + i % 250), 0))
            t = time.perf_counter()
            s.connect(("127.0.0.1", port))
            if s.recv(64):
                out[i] = (time.perf_counter() - t) * 1e3
            else:
                why[i] = "closed with no answer after %.1f ms" % ((time.perf_counter() - t) * 1e3)
        except OSError as e:
            why[i] = str(e)
        finally:
            s.close()

    common.open_loop(n, gap_ms / 1e3, one)
    for i, w in sorted(why.items()):
        log("[usecases] jit: client %d: %s" % (i, w))
    return out


def until(what, cond, timeout=60):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise RuntimeError("timed out waiting for %s" % what)
        time.sleep(0.05)


class JitPeer:
    """A private wispd serving daytime just in time on PORT: its state on a
    tmpfs of its own (wispapi.Daemon's `tmpfs`), a bridge and subnet of its
    own."""

    def __init__(self, wispd, extra, name):
        self.name = name
        self.d = wispapi.Daemon(wispd, os.path.join(ROOT, "build", "images"), pool="16M=4", tmpfs=True,
                                extra=["--bridge", "wjit0", "--subnet", "10.96.0.0/16"] + extra)
        self.api = self.d.api()
        st, _ = self.api.call("POST", "/v1/jit", {"image": "daytime", "port": {"host": PORT, "vm": 13}, "idle_ms": IDLE_MS})
        if st != 201:
            raise RuntimeError("POST /v1/jit: %s" % st)

    def settle(self):
        """No client's VM left (all idle ones removed), pool or group ready."""
        until("idle VMs removed", lambda: not self.api.call("GET", "/v1/vms")[1])
        time.sleep(0.3)  # (the refills after the removals: not a synchronisation, a quiet start)

    def stats(self):
        return self.api.call("GET", "/v1/jit")[1][0]

    def stop(self):
        # (Its log, kept: what a failed client met is in it.)
        shutil.copy(self.d.log.name, os.path.join(ROOT, "bench", "build", "usecases-%s.log" % self.name))
        self.d.stop()
        subprocess.run(["ip", "link", "del", "wjit0"], check=False, stderr=subprocess.DEVNULL)


class SocketActivated:
    def __init__(self, daytime):
        self.p = subprocess.Popen(["systemd-socket-activate", "-l", "127.0.0.1:%d" % PORT, "-a", "--inetd", daytime],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import socket

        def up():
            try:
                socket.create_connection(("127.0.0.1", PORT), timeout=1).close()
                return True
            except OSError:
                return False
        until("systemd-socket-activate listening", up, 10)

    def settle(self):
        time.sleep(0.3)

    def stats(self):
        return {}

    def stop(self):
        self.p.terminate()
        self.p.wait(5)


def run(args):
    """The jit part: its results and ratios."""
    if not shutil.which("systemd-socket-activate"):
        raise common.Skip("systemd-socket-activate not found (Debian's systemd)")
    daytime = common.cc(os.path.join(ROOT, "bench", "tools", "daytime.c"), os.path.join(ROOT, "bench", "build", "daytime"), static=True)
    wispd = os.path.join(os.path.dirname(os.path.abspath(args.wisp)), "wispd")
    peers = {
        "jit": lambda: JitPeer(wispd, ["--vms-per-process", "64"], "jit"),
        "jit_process": lambda: JitPeer(wispd, [], "jit_process"),
        "socket_activated": lambda: SocketActivated(daytime),
    }
    res = {p: {} for p in peers}
    net = 10
    for name, make in peers.items():
        peer = make()
        try:
            # A few clients first (images cached, groups made), then gone.
            arrivals(PORT, 50, 3, 200)
            for gap in RATES_MS:
                peer.settle()
                net += 1
                lat = arrivals(PORT, gap, args.clients, net)
                ok = sorted(x for x in lat if x is not None)
                res[name]["every_%dms" % gap] = {
                    "summary": common.summary(ok, 3) if ok else None,
                    "p90": round(common.percentile(ok, 90), 3) if ok else None,
                    "failed": len(lat) - len(ok),
                    "cdf_ms": [round(x, 3) for x in ok],
                    "server": peer.stats(),
                }
                log("[usecases] jit %s every %d ms: median %.2f ms, p90 %.2f, failed %d" % (
                    name, gap, ok[len(ok) // 2] if ok else -1, ok[int(len(ok) * .9)] if ok else -1, len(lat) - len(ok)))
        finally:
            peer.stop()
    med = lambda p, g: res[p]["every_%dms" % g]["summary"]["median"]  # noqa: E731
    # The headline is wispd's default, a VMM process per VM (peer
    # `jit_process`); groups (`--vms-per-process`, peer `jit`) beside it.
    ratios = {
        "jit_median_ms": round(med("jit_process", 10), 3),
        "jit_median_ms_every_25ms": round(med("jit_process", 25), 3),
        "jit_groups_median_ms": round(med("jit", 10), 3),
        "socket_activated_median_ms": round(med("socket_activated", 10), 3),
        "jit_vs_socket_activated": round(med("jit_process", 10) / med("socket_activated", 10), 3),
    }
    note = ("jit_*: connect to first byte of a new client's daytime answer, median ms, at one arrival per 10 ms (the target's"
            " rate) unless named; jit = a VM booted per client under wispd's default (a VMM process per VM), jit_groups = with"
            " groups (--vms-per-process 64), socket_activated = a process per connection (systemd-socket-activate --accept"
            " --inetd); jit_vs_socket_activated below 1: wisp answers sooner")
    part = {"method": __doc__.strip(), "clients": args.clients, "idle_ms": IDLE_MS, "peers": res}
    return part, ratios, note, {"jit_median_ms": 2.0}


def plot(ax_pair, part):
    """CDFs of first-response latency by peer, one axis per rate."""
    names = {"jit": "wisp JIT (groups)", "jit_process": "wisp JIT (a process per VM)", "socket_activated": "socket-activated process"}
    for ax, gap in zip(ax_pair, RATES_MS):
        for p, r in part["peers"].items():
            xs = r["every_%dms" % gap]["cdf_ms"]
            if xs:
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=names.get(p, p))
        ax.set_xscale("log")
        ax.set_xlabel("connect to first byte, ms (log)")
        ax.set_ylabel("fraction of clients")
        ax.set_title("jit: a new client every %d ms" % gap, fontsize=9)
        ax.axvline(2.0, color="grey", linestyle=":", linewidth=1)
        ax.legend(fontsize=7)
