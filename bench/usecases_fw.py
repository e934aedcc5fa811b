"""Item 3 of issue 18, personal firewalls (LightVM §7.1, Figure 16a): a
packet-filtering VM per client on the path of that client's traffic, 1,000
of them on one host, inside namespaces this benchmark makes (a router
namespace where wispd runs and the servers listen, and one namespace per
client). Every client has two ways to the servers, set up side by side:

- `wisp`: its link (`wisp run --link`) to its own firewall VM (the
  `firewall` image, groups of 64 VMs a VMM process), which routes it to
  the router namespace over wispd's bridge;
- `nftables`: a veth pair to the router namespace, with the same rules as
  nftables chains of its own there (reached through an `iifname` verdict
  map, as an operator would write 1,000 clients' rules), loaded only for
  this peer's runs.

The rules are the same for both: TCP to the server's port and its answers,
ICMP, DNS-like UDP at a rate, everything else denied; a client's packets
from another source are dropped. The same client tool for both
(bench/tools/flows.c): one process opens one TCP connection from each of
N active clients' namespaces, each paced by the kernel at 10 Mbit/s (4G
speeds, as in the paper), for DURATION seconds, to one sink (the same tool)
in the router namespace; throughput is what the sink received over the
time it received it. Added latency: one further client runs busybox ping
meanwhile (20 ms apart), through its firewall VM or its nftables chain.
Memory: the drop of MemAvailable (the page cache dropped before each
reading) from before to after the 1,000 firewall VMs booted, per VM, and
meminfo's parts of it; and again after every client's traffic went
through (the warm-up: WARMUP_S seconds from all clients on each path,
before the measured levels, so that they measure warm rings on both). Run by bench/usecases.py."""

import os
import re
import subprocess
import time

import common
import wispapi

log = common.log
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUTER = "wbfw-router"
SUBNET = "10.90.0.0/20"  # wispd's bridge: its gateway 10.90.0.1 is the wisp path's server address
NFT_SERVER = "10.91.0.1"  # the router's address on the nftables path (on its loopback)
PORT = 5201
RATE_BPS = 10_000_000
# Guest RAM of a firewall VM: its two NICs' rings (2 MiB each) and little else.
MEM = 8 << 20
# Seconds of traffic from every client through each path before the
# measured levels: a VM's rings are 4 MiB of guest memory it touches
# first as frames go round them (a page fault and a zeroed page each two
# frames), which a short run at low rates would measure instead.
WARMUP_S = 8
RULES = """default deny
allow out tcp port 5201
allow in tcp sport 5201
allow icmp
allow out udp port 53 rate 20/s
"""


def client(i):
    return "wbfc%d" % i


def link_net(i, second):
    """Client i's /30 on the wisp link (10.200/16) or the veth (10.201/16)."""
    base = (10 << 24) | ((201 if second else 200) << 16) | (4 * i)
    return [".".join(str(base + k >> s & 255) for s in (24, 16, 8, 0)) for k in (1, 2)]


def sh(args, **kw):
    return subprocess.run(args, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def batch(lines, netns=None):
    """`ip -batch` of `lines` (in netns `netns`)."""
    pre = ["ip", "-n", netns] if netns else ["ip"]
    for k in range(0, len(lines), 2000):
        sh(pre + ["-batch", "-"], input="\n".join(lines[k:k + 2000]) + "\n")


MEM_FIELDS = ("MemAvailable", "AnonPages", "SUnreclaim", "SReclaimable", "KernelStack", "PageTables", "Shmem")


def meminfo():
    """/proc/meminfo's fields in KiB, the page cache dropped first (else
    its ebb and flow is most of MemAvailable's change over a run)."""
    subprocess.run(["sync"], check=False)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            out[k] = int(v.split()[0])
    return out


def nft_rules(n):
    out = ["table ip wbfw {"]
    for i in range(n):
        _, peer = link_net(i, True)
        out.append("  chain c%d { ip saddr != %s drop; tcp dport %d accept; meta l4proto icmp accept; udp dport 53 limit rate 20/second accept; drop; }" % (i, peer, PORT))
        out.append("  chain o%d { tcp sport %d accept; meta l4proto icmp accept; drop; }" % (i, PORT))
    out.append("  map ins { type ifname : verdict; elements = { %s } }" % ", ".join('"wbv%d" : jump c%d' % (i, i) for i in range(n)))
    out.append("  map outs { type ifname : verdict; elements = { %s } }" % ", ".join('"wbv%d" : jump o%d' % (i, i) for i in range(n)))
    out.append("  chain input { type filter hook input priority 0; policy accept; iifname vmap @ins; }")
    out.append("  chain output { type filter hook output priority 0; policy accept; oifname vmap @outs; }")
    out.append("}")
    return "\n".join(out) + "\n"


def setup_clients(n):
    batch(["netns add %s" % client(i) for i in range(n)])
    # The nftables path: a veth a client, its far end in the router.
    lines = []
    for i in range(n):
        gw, _ = link_net(i, True)
        lines += ["link add wbv%d type veth peer name eth1 netns %s" % (i, client(i)), "addr add %s/30 dev wbv%d" % (gw, i), "link set wbv%d up" % i]
    batch(lines, ROUTER)
    for i in range(n):
        gw, me = link_net(i, True)
        batch(["link set lo up", "addr add %s/30 dev eth1" % me, "link set eth1 up", "route add %s via %s" % (NFT_SERVER, gw)], client(i))


def configure_links(n):
    for i in range(n):
        gw, me = link_net(i, False)
        batch(["addr add %s/30 dev eth0" % me, "route add 10.90.0.1 via %s" % gw], client(i))


def teardown(n):
    subprocess.run(["ip", "-batch", "-"], input="\n".join("netns del %s" % client(i) for i in range(n)) + "\n", text=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(["ip", "netns", "del", ROUTER], stderr=subprocess.DEVNULL)


def run_load(flows, server, active, pinger, seconds):
    """`active` clients' paced flows to `server` and one client's pings
    meanwhile: (Mbit/s received, failed connections, ping RTTs in ms)."""
    sink = subprocess.Popen(["ip", "netns", "exec", ROUTER, flows, "sink", str(PORT), str(len(active))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert sink.stdout.readline().strip() == "listening"
    count = int(seconds / 0.02) - 10
    ping = subprocess.Popen(["ip", "netns", "exec", pinger, "busybox", "ping", "-c", str(count), "-i", "0.02", server],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    send = sh([flows, "send", str(seconds), str(RATE_BPS), server, str(PORT)] + active)
    sent, failed = send.stdout.split()[1:3]
    out, _ = sink.communicate(input="done\n", timeout=60)
    nbytes, first, last, accepted = (int(x) for x in out.split()[1:5])
    failed = max(int(failed), len(active) - accepted)
    pout, _ = ping.communicate(timeout=120)
    rtts = sorted(float(m) for m in re.findall(r"time=([0-9.]+) ms", pout))
    mbps = nbytes * 8 / max(last - first, 1) * 1e3
    return mbps, failed, rtts, count


# The kernel's neighbour table is one for every namespace: 1,000 clients
# with a neighbour or two each, the router's 2,000, overflow its default
# (gc_thresh3 = 1024) and packets are dropped for want of an entry — on
# either path. Raised for the run, put back after.
NEIGH = {"gc_thresh1": "4096", "gc_thresh2": "16384", "gc_thresh3": "32768"}


def set_neigh(values):
    old = {}
    for k, v in values.items():
        path = "/proc/sys/net/ipv4/neigh/default/" + k
        with open(path) as f:
            old[k] = f.read().strip()
        with open(path, "w") as f:
            f.write(v)
    return old


def run(args):
    n = args.fw_vms
    seconds = args.fw_seconds
    levels = [a for a in (10, 50, 100, 200, 500, 1000) if a < n] + [n - 1]
    flows = common.cc(os.path.join(common.TOOLS, "flows.c"), os.path.join(common.BUILD, "flows"))
    teardown(n)
    neigh = set_neigh(NEIGH)
    sh(["ip", "netns", "add", ROUTER])
    batch(["link set lo up", "addr add %s/32 dev lo" % NFT_SERVER], ROUTER)
    d = None
    try:
        log("fw: %d client namespaces, each with a veth to the router" % n)
        setup_clients(n)
        rules = os.path.join(common.BUILD, "fw.rules")
        with open(rules, "w") as f:
            f.write(RULES)
        d = wispapi.Daemon(os.path.join(ROOT, "target/release/wispd"), os.path.join(ROOT, "build/images"), pool="16M=2", tmpfs=True,
                           extra=["--subnet", SUBNET, "--bridge", "wisp0", "--vms-per-process", "64"], netns=ROUTER)
        api = d.api()
        d.wait_pool(api, 2)
        before = meminfo()
        log("fw: %d firewall VMs" % n)
        import base64
        rules_b64 = base64.b64encode(RULES.encode()).decode()
        t0 = time.time()
        for i in range(n):
            gw, _ = link_net(i, False)
            st, r = api.call("POST", "/v1/vms", {"image": "firewall", "mem": MEM, "links": [{"netns": client(i), "address": gw + "/30"}],
                                                 "files": [{"path": "/rules", "data": rules_b64}]})
            if st != 201:
                raise RuntimeError("firewall %d: %s %s" % (i, st, r))
        made_s = time.time() - t0
        _, vms = api.call("GET", "/v1/vms")
        running = sum(1 for v in vms if v["state"] == "running")
        d.wait_pool(api, 2)
        after = meminfo()
        per_vm_kb = (before["MemAvailable"] - after["MemAvailable"]) / n
        parts_kb = {k: round((after[k] - before[k]) / n, 1) for k in MEM_FIELDS[1:]}
        log("fw: %d running, %.1f s to make, %.0f KiB each" % (running, made_s, per_vm_kb))
        configure_links(n)
        results = {"wisp": [], "nftables": []}
        for peer in ("wisp", "nftables"):
            server = "10.90.0.1" if peer == "wisp" else NFT_SERVER
            if peer == "nftables":
                sh(["ip", "netns", "exec", ROUTER, "nft", "-f", "-"], input=nft_rules(n))
            run_load(flows, server, [client(i) for i in range(n - 1)], client(n - 1), WARMUP_S)
            if peer == "wisp":
                warm = meminfo()
                warm_kb = (before["MemAvailable"] - warm["MemAvailable"]) / n
                log("fw: after the warm-up, %.0f KiB a VM" % warm_kb)
            for a in levels:
                mbps, failed, rtts, sent = run_load(flows, server, [client(i) for i in range(a)], client(n - 1), seconds)
                row = {"active": a, "mbps": round(mbps, 1), "offered_mbps": a * RATE_BPS / 1e6, "failed": failed,
                       "rtt_ms_median": round(common.median(rtts), 3) if rtts else None,
                       "rtt_ms_p99": round(common.percentile(rtts, 99), 3) if rtts else None, "pings": len(rtts), "pings_sent": sent}
                results[peer].append(row)
                log("fw: %s %d active: %.0f Mbit/s, rtt %s ms (%d/%d pings), %d failed" % (peer, a, mbps, row["rtt_ms_median"], len(rtts), sent, failed))
            if peer == "nftables":
                sh(["ip", "netns", "exec", ROUTER, "nft", "delete", "table", "ip", "wbfw"])
    finally:
        if d:
            d.stop()
        teardown(n)
        set_neigh(neigh)
    top = levels[-1]
    w = next(r for r in results["wisp"] if r["active"] == top)
    f = next(r for r in results["nftables"] if r["active"] == top)
    best_w = max(r["mbps"] for r in results["wisp"])
    best_f = max(r["mbps"] for r in results["nftables"])
    ratios = {
        "firewall_throughput_vs_nftables": round(w["mbps"] / f["mbps"], 3),
        "firewall_peak_throughput_vs_nftables": round(best_w / best_f, 3),
        "firewall_mem_per_vm_kb": round(per_vm_kb, 1),
        "firewall_mem_per_vm_kb_after_traffic": round(warm_kb, 1),
        "firewall_added_rtt_ms": round((w["rtt_ms_median"] or 0) - (f["rtt_ms_median"] or 0), 3),
    }
    part = {"vms": n, "mem": MEM, "warmup_s": WARMUP_S, "running": running, "made_s": round(made_s, 2), "mem_per_vm_kb": round(per_vm_kb, 1), "meminfo_per_vm_kb": parts_kb, "seconds": seconds,
            "rate_bps_per_client": RATE_BPS, "rules": RULES, "results": results}
    note = ("firewall: %d firewall VMs (%.0f KiB of host memory each); throughput ratio at %d active clients (each paced at 10 Mbit/s); "
            "peak: each peer's best level; added RTT: median ping through the VM minus through nftables at that level." % (n, per_vm_kb, top))
    targets = {"firewall_throughput_vs_nftables": ">= 0.8", "firewall_mem_per_vm_kb": "<= 1024"}
    return part, ratios, note, targets


def plot(row, part):
    ax, bx = row
    for peer, style in (("wisp", "o-"), ("nftables", "s--")):
        rs = part["results"][peer]
        ax.plot([r["active"] for r in rs], [r["mbps"] for r in rs], style, label=peer)
        bx.plot([r["active"] for r in rs], [r["rtt_ms_median"] for r in rs], style, label=peer)
    rs = part["results"]["wisp"]
    ax.plot([r["active"] for r in rs], [r["offered_mbps"] for r in rs], ":", color="grey", label="offered")
    ax.set_xlabel("active clients (10 Mbit/s each)")
    ax.set_ylabel("Mbit/s received")
    ax.set_title("personal firewalls: %d VMs, %.0f KiB each" % (part["vms"], part["mem_per_vm_kb"]))
    ax.legend(fontsize=8)
    bx.set_xlabel("active clients")
    bx.set_ylabel("ping RTT median (ms)")
    bx.set_title("a further client's ping meanwhile")
    bx.legend(fontsize=8)
