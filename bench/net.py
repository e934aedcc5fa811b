#!/usr/bin/env python3
"""Network study: wisp vs a container, native (loopback) and a Linux VM.

Follows "Quantitative Analysis of KVM, Container, and Unikernel Environment
Based on TCP/UDP Network Performance": with the host's iperf3 client, TCP
stream throughput against message size (-l) and socket buffer size (-w), UDP
throughput and loss against datagram size, and 1-byte TCP request/response
latency against an echo server. Everything runs inside one network namespace
this script creates (and removes, also on error/Ctrl-C); traffic never leaves
it. See bench/README.md.

    python3 bench/net.py --wisp target/release/wisp --out bench/results/net.json
"""

import argparse
import datetime
import glob
import json
import re
import os
import shutil
import signal
import socket
import stat
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
BUILD = os.path.join(BENCH, "build")
sys.path.insert(0, BENCH)
import common  # noqa: E402  (cpio_newc, host_tsc_khz, machine_info, log, Skip, version_key)

log = common.log
Skip = common.Skip

KB = 1024
MSG_SIZES = [64, 256, 1 * KB, 4 * KB, 16 * KB, 64 * KB, 128 * KB]
MSG_SIZES_SLOW = [1 * KB, 16 * KB, 128 * KB]
WINDOWS = [16 * KB, 64 * KB, 256 * KB]
UDP_SIZES = [64, 512, 1024, 1472]
UDP_SIZES_SLOW = [1472]
UDP_RATE = "200M"
VM_READY = "WISP_NET_READY"
VM_MODULES = ["virtio_ring", "virtio", "virtio_mmio", "failover", "net_failover", "virtio_net"]


def human(n):
    return "%dK" % (n // KB) if n >= KB and n % KB == 0 else str(n)


# --------------------------------------------------------------------------
# helper modes (run inside a namespace / environment by this same script)


def echo_server(port):
    """Tiny threaded TCP echo server (the non-wisp environments' peer of wisp's `echo`)."""
    import threading
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(16)
    print("echo-server: listening on %d" % port, flush=True)

    def serve(c):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with c:
            while True:
                d = c.recv(65536)
                if not d:
                    return
                c.sendall(d)
    while True:
        c, _ = srv.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def rr_client(host, port, secs):
    """1-byte TCP ping-pong for `secs` seconds; prints JSON with the RTTs in us."""
    s = socket.create_connection((host, port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(20):  # warm-up
        s.sendall(b"x")
        s.recv(1)
    rtts = []
    end = time.monotonic() + secs
    clock = time.perf_counter_ns
    while time.monotonic() < end:
        t0 = clock()
        s.sendall(b"x")
        if not s.recv(1):
            break
        rtts.append((clock() - t0) / 1000.0)
    s.close()
    print(json.dumps(rtts))


# --------------------------------------------------------------------------
# namespace plumbing


def run(argv, check=True, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError("%s failed (rc %d): %s" % (" ".join(argv), r.returncode, (r.stderr or r.stdout).strip()))
    return r


class Net:
    def __init__(self):
        tag = os.getpid()
        self.ns = "wispnet-%d" % tag
        self.ns2 = "wispnet-%dc" % tag
        self.procs = []

    def x(self, *argv, ns=None, check=True):
        return run(["ip", "netns", "exec", ns or self.ns] + list(argv), check=check)

    def up(self):
        for n in (self.ns, self.ns2):
            run(["ip", "netns", "add", n])
            self.x("ip", "link", "set", "lo", "up", ns=n)
        for tap, cidr in (("wtap0", "10.88.0.1/24"), ("wtap1", "10.88.1.1/24"), ("qtap0", "10.88.3.1/24")):
            self.x("ip", "tuntap", "add", "dev", tap, "mode", "tap")
            self.x("ip", "addr", "add", cidr, "dev", tap)
            self.x("ip", "link", "set", tap, "up")
        self.x("ip", "link", "add", "veth0", "type", "veth", "peer", "name", "veth1")
        self.x("ip", "link", "set", "veth1", "netns", self.ns2)
        self.x("ip", "addr", "add", "10.88.2.1/24", "dev", "veth0")
        self.x("ip", "link", "set", "veth0", "up")
        self.x("ip", "addr", "add", "10.88.2.2/24", "dev", "veth1", ns=self.ns2)
        self.x("ip", "link", "set", "veth1", "up", ns=self.ns2)

    def spawn(self, argv, logname, ns=None, env=None):
        path = os.path.join(BUILD, "net-%s.log" % logname)
        f = open(path, "w")
        p = subprocess.Popen(["ip", "netns", "exec", ns or self.ns] + argv, stdin=subprocess.DEVNULL,
                             stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        p.logpath = path
        self.procs.append(p)
        return p

    def stop(self, p):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(5)
            except Exception:  # noqa: BLE001
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(5)
                except Exception:  # noqa: BLE001
                    pass

    def down(self):
        for p in self.procs:
            self.stop(p)
        for n in (self.ns2, self.ns):
            run(["ip", "netns", "del", n], check=False)


def wait_for(p, text, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(p.logpath, errors="replace") as f:
            if text in f.read():
                return
        if p.poll() is not None:
            break
        time.sleep(0.05)
    with open(p.logpath, errors="replace") as f:
        tail = f.read()[-600:]
    raise Skip("server did not print %r (rc %s): %s" % (text, p.poll(), tail.strip()))


def wait_port(net, host, port, timeout):
    code = ("import socket,sys,time\nend=time.time()+%f\n"
            "while time.time()<end:\n"
            " try: socket.create_connection((%r,%d),1).close(); sys.exit(0)\n"
            " except OSError: time.sleep(0.1)\nsys.exit(1)\n") % (timeout, host, port)
    if net.x(sys.executable, "-c", code, check=False).returncode != 0:
        raise Skip("nothing listening on %s:%d after %ds" % (host, port, timeout))


# --------------------------------------------------------------------------
# measurements (client always in the main namespace)


def iperf(net, host, secs, length, window=None, udp=False):
    argv = ["iperf3", "-c", host, "-p", "5201", "-t", str(secs), "-l", str(length), "--json", "--connect-timeout", "5000"]
    if window:
        argv += ["-w", str(window)]
    if udp:
        argv += ["-u", "-b", UDP_RATE]
    last = None
    for _ in range(3):
        r = net.x(*argv, check=False)
        try:
            j = json.loads(r.stdout)
        except ValueError:
            j = {"error": (r.stderr or r.stdout).strip()[-300:]}
        if "error" not in j and r.returncode == 0:
            end = j["end"]
            if udp:
                srv = end.get("sum_received") or end["sum"]
                snd = end.get("sum_sent") or end["sum"]
                return {"gbps": srv["bits_per_second"] / 1e9, "sent_gbps": snd["bits_per_second"] / 1e9,
                        "loss_pct": srv.get("lost_percent"), "lost": srv.get("lost_packets"),
                        "packets": srv.get("packets"), "jitter_ms": srv.get("jitter_ms")}
            return {"gbps": end["sum_received"]["bits_per_second"] / 1e9,
                    "sent_gbps": end["sum_sent"]["bits_per_second"] / 1e9,
                    "retransmits": end["sum_sent"].get("retransmits")}
        last = j.get("error")
        time.sleep(1)
    return {"error": last}


def rr(net, host, port, secs):
    r = net.x(sys.executable, os.path.abspath(__file__), "--rr-client", host, str(port), str(secs), check=False)
    try:
        rtts = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (r.stderr or r.stdout).strip()[-300:]}
    s = sorted(rtts)
    return {"round_trips": len(s), "median_us": statistics.median(s), "mean_us": statistics.mean(s),
            "p99_us": s[min(len(s) - 1, int(len(s) * 0.99))], "min_us": s[0],
            "rps": len(s) / secs}


def ping(net, host, count=50):
    """ICMP round trip from the namespace to `host` (busybox ping, -A: next
    request as soon as the reply arrives)."""
    r = net.x("busybox", "ping", "-A", "-c", str(count), "-W", "5", host, check=False)
    m = re.search(r"round-trip min/avg/max = ([\d.]+)/([\d.]+)/([\d.]+) ms", r.stdout)
    if not m:
        return {"error": (r.stderr or r.stdout).strip()[-300:]}
    rec = re.search(r"(\d+) packets received", r.stdout)
    return {"count": count, "received": int(rec.group(1)) if rec else None,
            "min_us": float(m.group(1)) * 1e3, "avg_us": float(m.group(2)) * 1e3, "max_us": float(m.group(3)) * 1e3}


def measure(net, env, host, echo_host, slow, args):
    t = args.slow_secs if slow else args.secs
    res = {"iperf_host": host, "echo_host": echo_host, "secs": t, "tcp": {}, "window": {}, "udp": {}}
    for L in (MSG_SIZES_SLOW if slow else MSG_SIZES):
        res["tcp"][str(L)] = v = iperf(net, host, t, L)
        log("  %-9s tcp  -l %-5s %s" % (env, human(L), fmtres(v)))
    for W in WINDOWS:
        res["window"][str(W)] = v = iperf(net, host, t, 128 * KB, window=W)
        log("  %-9s tcp  -w %-5s %s" % (env, human(W), fmtres(v)))
    for L in (UDP_SIZES_SLOW if slow else UDP_SIZES):
        res["udp"][str(L)] = v = iperf(net, host, t, L, udp=True)
        log("  %-9s udp  -l %-5s %s" % (env, human(L), fmtres(v)))
    res["ping"] = v = ping(net, host)
    log("  %-9s ping %s" % (env, "error: %s" % v["error"] if "error" in v else "avg %.1f us" % v["avg_us"]))
    res["rr"] = v = rr(net, echo_host, 7, args.rr_secs)
    log("  %-9s rr   %s" % (env, "error: %s" % v["error"] if "error" in v else
                            "median %.1f us, p99 %.1f us, %d round trips" % (v["median_us"], v["p99_us"], v["round_trips"])))
    return res


def fmtres(v):
    if "error" in v:
        return "error: %s" % v["error"]
    s = "%.3f Gbit/s" % v["gbps"]
    if v.get("loss_pct") is not None:
        s += ", loss %.2f%%" % v["loss_pct"]
    return s


# --------------------------------------------------------------------------
# environments


def env_wisp(net, args):
    if not args.wisp or not os.access(args.wisp, os.X_OK):
        raise Skip("no wisp binary at %r (make all)" % args.wisp)
    images = os.path.join(ROOT, "build", "images")
    for img in ("iperf", "echo"):
        if not os.path.exists(os.path.join(images, img)):
            raise Skip("no %s image in build/images (make all)" % img)
    env = dict(os.environ, WISP_SOCKET="/nonexistent/wisp-bench.sock", WISP_IMAGE_DIR=images)
    wisp = os.path.abspath(args.wisp)
    p1 = net.spawn([wisp, "run", "--timeout", "600s", "--tap", "wtap0", "--ip", "10.88.0.2/24", "iperf"], "wisp-iperf", env=env)
    p2 = net.spawn([wisp, "run", "--timeout", "600s", "--tap", "wtap1", "--ip", "10.88.1.2/24", "echo"], "wisp-echo", env=env)
    wait_for(p1, "listening", 30)
    wait_for(p2, "listening", 30)
    return "10.88.0.2", "10.88.1.2", [p1, p2], {
        "iperf": "wisp run --tap wtap0 --ip 10.88.0.2/24 iperf", "echo": "wisp run --tap wtap1 --ip 10.88.1.2/24 echo"}


def _plain_servers(net, ns, host, name):
    if not shutil.which("iperf3"):
        raise Skip("iperf3 not found (scripts/install-bench-deps.sh)")
    p1 = net.spawn(["iperf3", "-s", "-p", "5201", "--forceflush"], name + "-iperf", ns=ns)
    p2 = net.spawn([sys.executable, os.path.abspath(__file__), "--echo-server", "7"], name + "-echo", ns=ns)
    wait_for(p1, "Server listening", 10)
    wait_for(p2, "listening", 10)
    wait_port(net, host, 7, 10)
    return host, host, [p1, p2], {"iperf": "iperf3 -s", "echo": "python3 net.py --echo-server 7"}


def env_container(net, args):
    return _plain_servers(net, net.ns2, "10.88.2.2", "container")


def env_native(net, args):
    return _plain_servers(net, net.ns, "127.0.0.1", "native")


def _file_bytes(path):
    with open(os.path.realpath(path), "rb") as f:
        return f.read()


def build_vm_initramfs(kver, out):
    bb = "/bin/busybox"
    iperf3 = shutil.which("iperf3")
    if not iperf3:
        raise Skip("iperf3 not found")
    entries = [(d, stat.S_IFDIR | 0o755, b"", (0, 0)) for d in
               ("bin", "dev", "proc", "sys", "tmp", "lib", "lib/x86_64-linux-gnu", "lib64", "mods")]
    entries += [("bin/busybox", stat.S_IFREG | 0o755, _file_bytes(bb), (0, 0)),
                ("bin/sh", stat.S_IFLNK | 0o777, b"busybox", (0, 0)),
                ("dev/console", stat.S_IFCHR | 0o600, b"", (5, 1)),
                ("bin/iperf3", stat.S_IFREG | 0o755, _file_bytes(iperf3), (0, 0))]
    ldd = run(["ldd", iperf3]).stdout
    for line in ldd.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if not path.startswith("/"):
            continue
        name = "lib64/" + os.path.basename(path) if "ld-linux" in path else "lib/x86_64-linux-gnu/" + os.path.basename(path)
        entries.append((name, stat.S_IFREG | 0o755, _file_bytes(path), (0, 0)))
    mdir = "/lib/modules/%s/kernel" % kver
    for m in VM_MODULES:
        found = glob.glob(mdir + "/**/%s.ko*" % m, recursive=True)
        if not found:
            raise Skip("module %s.ko not found under %s" % (m, mdir))
        data = _file_bytes(found[0])
        if found[0].endswith(".xz"):
            data = subprocess.run(["xz", "-dc", found[0]], capture_output=True, check=True).stdout
        elif found[0].endswith(".zst"):
            data = subprocess.run(["zstd", "-dc", found[0]], capture_output=True, check=True).stdout
        entries.append(("mods/%s.ko" % m, stat.S_IFREG | 0o644, data, (0, 0)))
    init = ("#!/bin/busybox sh\n"
            "/bin/busybox --install -s /bin\n"
            "export PATH=/bin\n"
            "mount -t devtmpfs dev /dev; mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t tmpfs tmp /tmp\n"
            "for m in %s; do insmod /mods/$m.ko; done\n"
            "ip link set lo up\n"
            "ip addr add 10.88.3.2/24 dev eth0 && ip link set eth0 up\n"
            "iperf3 -s -D -p 5201\n"
            "nc -ll -p 7 -e cat &\n"
            "sleep 1\n"
            "echo %s\n"
            "exec sleep 100000\n") % (" ".join(VM_MODULES), VM_READY)
    entries.append(("init", stat.S_IFREG | 0o755, init.encode(), (0, 0)))
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(common.cpio_newc(entries))
    os.replace(tmp, out)


def env_linux_vm(net, args):
    if not shutil.which("qemu-system-x86_64"):
        raise Skip("qemu-system-x86_64 not found (scripts/install-bench-deps.sh)")
    kernels = sorted(glob.glob("/boot/vmlinuz-*-cloud-amd64"), key=common.version_key)
    if not kernels:
        raise Skip("no /boot/vmlinuz-*-cloud-amd64 (apt-get install linux-image-cloud-amd64)")
    kernel = kernels[-1]
    kver = os.path.basename(kernel)[len("vmlinuz-"):]
    initrd = os.path.join(BUILD, "net-linux-initramfs.cpio")
    build_vm_initramfs(kver, initrd)
    khz = common.host_tsc_khz()
    append = "console=ttyS0 quiet panic=-1" + (" tsc_early_khz=%d" % khz if khz else "")
    argv = ["qemu-system-x86_64", "-accel", "tcg", "-M", "microvm", "-m", "512M", "-smp", "1",
            "-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
            "-netdev", "tap,id=n0,ifname=qtap0,script=no,downscript=no",
            "-device", "virtio-net-device,netdev=n0",
            "-kernel", kernel, "-initrd", initrd, "-append", append]
    p = net.spawn(argv, "linux-vm")
    wait_for(p, VM_READY, 180)
    wait_port(net, "10.88.3.2", 7, 30)
    return "10.88.3.2", "10.88.3.2", [p], {"vm": " ".join(argv), "iperf": "iperf3 -s -D", "echo": "busybox nc -ll -p 7 -e cat"}


ENVS = [("wisp", env_wisp, False), ("container", env_container, False),
        ("native", env_native, False), ("linux_vm", env_linux_vm, True)]


# --------------------------------------------------------------------------
# report


def tcp_ratio(results, peer, min_size=0):
    w, p = results.get("wisp", {}).get("tcp"), results.get(peer, {}).get("tcp")
    if not w or not p:
        return None
    rs = [w[k]["gbps"] / p[k]["gbps"] for k in w if k in p and int(k) >= min_size
          and "gbps" in w[k] and "gbps" in p[k] and p[k]["gbps"] > 0]
    return min(rs) if rs else None


def ratios(results):
    out = {"tcp_min_vs_container": tcp_ratio(results, "container", 16 * KB),
           "tcp_min_vs_native": tcp_ratio(results, "native", 16 * KB),
           "tcp_min_vs_linux_vm": tcp_ratio(results, "linux_vm")}
    try:
        out["rr_latency_vs_container"] = results["wisp"]["rr"]["median_us"] / results["container"]["rr"]["median_us"]
    except (KeyError, TypeError, ZeroDivisionError):
        out["rr_latency_vs_container"] = None
    try:
        out["ping_rtt_vs_container"] = results["wisp"]["ping"]["avg_us"] / results["container"]["ping"]["avg_us"]
    except (KeyError, TypeError, ZeroDivisionError):
        out["ping_rtt_vs_container"] = None
    return out


def print_table(doc):
    envs = [e for e in doc["environments"] if "skipped" not in doc["environments"][e]]
    res = doc["environments"]
    cell = lambda v, key="gbps", nd=3: "-" if not v or key not in v or v[key] is None else "%.*f" % (nd, v[key])  # noqa: E731
    print("\nTCP throughput (Gbit/s) vs message size (-l)")
    print("%-8s" % "size" + "".join("%12s" % e for e in envs))
    for L in MSG_SIZES:
        print("%-8s" % human(L) + "".join("%12s" % cell(res[e]["tcp"].get(str(L))) for e in envs))
    print("\nTCP throughput (Gbit/s) vs socket buffer (-w, -l 128K)")
    for W in WINDOWS:
        print("%-8s" % human(W) + "".join("%12s" % cell(res[e]["window"].get(str(W))) for e in envs))
    print("\nUDP throughput (Gbit/s) / loss %% vs datagram size (-b %s)" % UDP_RATE)
    for L in UDP_SIZES:
        print("%-8s" % human(L) + "".join("%12s" % ("%s/%s" % (cell(res[e]["udp"].get(str(L))), cell(res[e]["udp"].get(str(L)), "loss_pct", 1))
                                                     if res[e]["udp"].get(str(L)) else "-") for e in envs))
    print("\nTCP 1-byte request/response latency (us): median / p99")
    print("%-8s" % "" + "".join("%12s" % ("%s/%s" % (cell(res[e]["rr"], "median_us", 1), cell(res[e]["rr"], "p99_us", 0))) for e in envs))
    for e, v in res.items():
        if "skipped" in v:
            print("skipped %s: %s" % (e, v["skipped"]))
    print("\nratios (wisp / peer):")
    for k, v in doc["ratios"].items():
        print("  %-26s %s" % (k, "-" if v is None else "%.3f" % v))


COLORS = {"wisp": "tab:red", "container": "tab:blue", "native": "tab:green", "linux_vm": "tab:purple"}


def plot(doc, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    res = {e: v for e, v in doc["environments"].items() if "skipped" not in v}

    def series(e, key, field="gbps"):
        pts = sorted((int(k), v[field]) for k, v in res[e][key].items() if v.get(field) is not None)
        return [p[0] for p in pts], [p[1] for p in pts]

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    nat = dict(zip(*series("native", "tcp"))) if "native" in res else {}
    for e in res:
        xs, ys = series(e, "tcp")
        a1.plot(xs, ys, "o-", label=e, color=COLORS.get(e))
        rel = [(x, y / nat[x]) for x, y in zip(xs, ys) if nat.get(x)]
        if rel:
            a2.plot([r[0] for r in rel], [r[1] for r in rel], "o-", label=e, color=COLORS.get(e))
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xlabel("message size (bytes, iperf3 -l)")
        a.grid(True, alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend()
    a1.set_ylabel("TCP throughput (Gbit/s)")
    a1.set_title("TCP stream throughput vs message size")
    a2.set_ylabel("throughput / native")
    a2.set_title("relative to native (loopback)")
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "net-tcp.png"), dpi=110)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for e in res:
        xs, ys = series(e, "udp")
        a1.plot(xs, ys, "o-", label=e, color=COLORS.get(e))
        xs, ys = series(e, "udp", "loss_pct")
        a2.plot(xs, ys, "o-", label=e, color=COLORS.get(e))
    a1.set_ylabel("UDP throughput received (Gbit/s)")
    a2.set_ylabel("loss (%)")
    a1.set_title("UDP throughput vs datagram size (-b %s)" % UDP_RATE)
    a2.set_title("UDP loss vs datagram size")
    for a in (a1, a2):
        a.set_xlabel("datagram size (bytes)")
        a.set_xscale("log", base=2)
        a.grid(True, alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "net-udp.png"), dpi=110)

    fig, a = plt.subplots(figsize=(6.5, 4.5))
    for e in res:
        xs, ys = series(e, "window")
        a.plot(xs, ys, "o-", label=e, color=COLORS.get(e))
    a.set_xscale("log", base=2)
    a.set_xlabel("socket buffer (bytes, iperf3 -w; -l 128K)")
    a.set_ylabel("TCP throughput (Gbit/s)")
    a.set_title("TCP throughput vs socket buffer size")
    a.grid(True, alpha=0.3)
    a.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "net-window.png"), dpi=110)


def do_plot(out):
    outdir = os.path.dirname(os.path.abspath(out))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
            r = subprocess.run(["/usr/bin/python3", os.path.abspath(__file__), "--plot-only", out])
            if r.returncode != 0:
                log("plot failed under /usr/bin/python3")
            return
        log("no matplotlib: no plots")
        return
    with open(out) as f:
        plot(json.load(f), outdir)
    log("plots: %s/net-{tcp,udp,window}.png" % outdir)


# --------------------------------------------------------------------------


def _on_sigterm(*_):
    raise KeyboardInterrupt()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wisp", default=os.path.join(ROOT, "target/release/wisp"))
    ap.add_argument("--out", default=os.path.join(BENCH, "results/net.json"))
    ap.add_argument("--envs", default=",".join(e[0] for e in ENVS))
    ap.add_argument("--secs", type=int, default=2, help="iperf3 -t per point (default 2)")
    ap.add_argument("--slow-secs", type=int, default=1, help="-t for the Linux VM (TCG; default 1)")
    ap.add_argument("--rr-secs", type=float, default=2.0)
    ap.add_argument("--echo-server", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rr-client", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--plot-only", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.echo_server:
        return echo_server(args.echo_server)
    if args.rr_client:
        return rr_client(args.rr_client[0], int(args.rr_client[1]), float(args.rr_client[2]))
    if args.plot_only:
        with open(args.plot_only) as f:
            plot(json.load(f), os.path.dirname(os.path.abspath(args.plot_only)))
        return 0
    if os.geteuid() != 0:
        sys.exit("net.py: run as root (network namespaces, taps, /dev/kvm)")
    os.makedirs(BUILD, exist_ok=True)
    want = args.envs.split(",")
    net = Net()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _on_sigterm)
    results = {}
    try:
        net.up()
        log("namespace %s (container: %s)" % (net.ns, net.ns2))
        for name, fn, slow in ENVS:
            if name not in want:
                continue
            log("%s:" % name)
            procs = []
            try:
                host, echo_host, procs, cmds = fn(net, args)
                r = measure(net, name, host, echo_host, slow, args)
                r["commands"] = cmds
                results[name] = r
            except Skip as e:
                log("  skipped: %s" % e)
                results[name] = {"skipped": str(e)}
            finally:
                for p in procs:
                    net.stop(p)
    except KeyboardInterrupt:
        log("interrupted")
        raise
    finally:
        net.down()
    doc = {"benchmark": "net", "machine": common.machine_info(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "method": {"client": "host iperf3 (%s) inside the namespace" % run(["iperf3", "--version"], check=False).stdout.splitlines()[0],
                      "tcp_msg_sizes": MSG_SIZES, "tcp_msg_sizes_linux_vm": MSG_SIZES_SLOW,
                      "windows": WINDOWS, "udp_sizes": UDP_SIZES, "udp_sizes_linux_vm": UDP_SIZES_SLOW,
                      "udp_rate": UDP_RATE, "secs": args.secs, "slow_secs": args.slow_secs,
                      "rr": "1-byte TCP ping-pong, TCP_NODELAY, %.1f s, Python client" % args.rr_secs,
                      "gbps": "receiver side (server) bits/s / 1e9"},
           "environments": results}
    doc["ratios"] = ratios(results)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print_table(doc)
    do_plot(args.out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main() or 0)
    except KeyboardInterrupt:
        log("net.py: interrupted; namespace and servers removed")
        sys.exit(130)
