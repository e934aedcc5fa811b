#!/usr/bin/env python3
"""The content cache against nginx (issue 14, item 7), all inside one
network namespace this script makes (and removes, also on error): wrk
(Debian) against

- the cache VM (`cache` app, an SHFS volume read-only, through a wispd of
  this script's own; reached at its address on the bridge, over its tap),
- nginx (Debian's nginx-light) as a host process on loopback ("native"),
- nginx in a namespace container: its own network namespace (a veth pair),
  mount and PID namespaces,

each serving the same objects under the same names: 0 B, 1 KB, 10 KB and
100 KB at 1, 50 and 500 connections (requests/s, p50/p99 latency; one wrk
thread; one nginx worker, as the VM has one vCPU), a 256 MB object's
throughput (curl, whole downloads), the time from `wisp run` to the first
byte served by a new cache VM with a mounted volume (median of 11), and the host memory
(PSS) of an idle cache VM's VMM process, and the aggregate requests/s of
1, 2, 4 and 8 cache VMs sharing one read-only volume (one wrk per VM at
once, 0 B objects, 50 connections each).

    python3 bench/cache.py --wisp target/release/wisp --out bench/results/cache.json
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import common  # noqa: E402

log = common.log
NS = "wisp-bcache-%d" % os.getpid()
CNS = NS + "-c"
SIZES = [("0B", 0), ("1KB", 1000), ("10KB", 10_000), ("100KB", 100_000)]
CONNS = [1, 50, 500]


def sh(*argv, ns=None, check=True, **kw):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(argv)
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


def wrk(url, conns, seconds):
    out = sh("wrk", "-t1", "-c%d" % conns, "-d%ds" % seconds, "--latency", url, ns=NS).stdout
    rps = float(re.search(r"Requests/sec:\s*([\d.]+)", out).group(1))

    def lat(p):
        m = re.search(r"^\s*%s%%\s+([\d.]+)(us|ms|s)" % p, out, re.M)
        v, unit = float(m.group(1)), m.group(2)
        return v * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sockerr = re.search(r"Socket errors: (.*)", out)
    return {"rps": rps, "p50_ms": lat(50), "p99_ms": lat(99), "non2xx": int(errors.group(1)) if errors else 0,
            "socket_errors": sockerr.group(1) if sockerr else ""}


def wait_http(host, port, path, deadline_s=20):
    t = time.time()
    while time.time() - t < deadline_s:
        try:
            s = socket.create_connection((host, port), timeout=1)
            s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path).encode())
            if s.recv(1):
                s.close()
                return time.time()
        except OSError:
            time.sleep(0.001)
    raise SystemExit("no answer from %s:%d%s" % (host, port, path))


NGINX_CONF = """daemon off; user root; worker_processes 1; pid %(dir)s/nginx-%(tag)s.pid; error_log %(dir)s/nginx-%(tag)s.err;
events { worker_connections 4096; }
http { access_log off; sendfile on; tcp_nopush on; tcp_nodelay on; keepalive_requests 1000000; keepalive_timeout 60;
  types { text/plain txt; application/octet-stream bin; } default_type application/octet-stream;
  client_body_temp_path %(dir)s/tmp; proxy_temp_path %(dir)s/tmp; fastcgi_temp_path %(dir)s/tmp; uwsgi_temp_path %(dir)s/tmp; scgi_temp_path %(dir)s/tmp;
  server { listen %(addr)s backlog=4096; root %(root)s; } }
"""


def plot(doc, png):
    """Requests/s of the three peers per object size and connection count
    (grouped bars). False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    keys = list(doc["rps"]["wisp_cache"])
    xs = range(len(keys))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for i, (p, label, color) in enumerate([("wisp_cache", "cache VM", "tab:red"), ("nginx_native", "nginx native", "tab:blue"),
                                           ("nginx_container", "nginx container", "tab:green")]):
        ax.bar([x + (i - 1) * 0.27 for x in xs], [doc["rps"][p][k]["rps"] / 1e3 for k in keys], 0.27, label=label, color=color)
    ax.set_xticks(list(xs), [k.replace("_c", "\n") + " conn" for k in keys], fontsize=7)
    ax.set_ylabel("thousand requests/s (wrk)")
    ax.set_title("content cache vs nginx, %s" % doc["machine"].get("cpu_model", ""), fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return True


def main():
    def own(ap):
        ap.add_argument("--wisp", default=os.path.join(ROOT, "target/release/wisp"))
        ap.add_argument("--seconds", type=int, default=4)
    args = common.bench_args(__doc__, os.path.join(ROOT, "bench/results/cache.json"), plot, own)
    if args is None:
        return
    png = args.png
    wisp = os.path.abspath(args.wisp)
    wispd = os.path.join(os.path.dirname(wisp), "wispd")
    work = tempfile.mkdtemp(prefix="wisp-bench-cache-")
    procs = []
    try:
        root = os.path.join(work, "objects")
        os.makedirs(root)
        for name, size in SIZES:
            with open(os.path.join(root, name), "wb") as f:
                f.write(bytes((i * 7) % 251 for i in range(size)))
        with open(os.path.join(root, "big"), "wb") as f:
            block = bytes((i * 13) % 251 for i in range(1 << 20))
            for _ in range(256):
                f.write(block)
        vol = os.path.join(work, "cache.img")
        subprocess.run([wisp, "shfs", "mkfs", vol, "--size", "320M", "--chunk", "32K", "--objects", "64"], check=True, capture_output=True)
        subprocess.run([wisp, "shfs", "add", vol, root], check=True, capture_output=True)
        os.makedirs(os.path.join(work, "tmp"))
        # The namespace, and the container's.
        subprocess.run(["ip", "netns", "add", NS], check=True)
        subprocess.run(["ip", "netns", "add", CNS], check=True)
        sh("ip", "link", "set", "lo", "up", ns=NS)
        sh("ip", "link", "set", "lo", "up", ns=CNS)
        sh("ip", "link", "add", "vb0", "type", "veth", "peer", "name", "vc0", ns=NS)
        sh("ip", "link", "set", "vc0", "netns", CNS, ns=NS)
        sh("ip", "addr", "add", "10.125.0.1/24", "dev", "vb0", ns=NS)
        sh("ip", "link", "set", "vb0", "up", ns=NS)
        sh("ip", "addr", "add", "10.125.0.2/24", "dev", "vc0", ns=CNS)
        sh("ip", "link", "set", "vc0", "up", ns=CNS)
        # nginx native and in the container.
        for tag, addr, ns in (("native", "127.0.0.1:8081", NS), ("container", "10.125.0.2:80", CNS)):
            conf = os.path.join(work, "nginx-%s.conf" % tag)
            with open(conf, "w") as f:
                f.write(NGINX_CONF % {"dir": work, "tag": tag, "addr": addr, "root": root})
            pre = ["unshare", "--mount", "--pid", "--fork", "--mount-proc"] if tag == "container" else []
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns] + pre + ["nginx", "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # wispd and the cache VM.
        sock = os.path.join(work, "wispd.sock")
        procs.append(subprocess.Popen(["ip", "netns", "exec", NS, wispd, "--socket", sock, "--state-dir", os.path.join(work, "state"),
                                       "--subnet", "10.124.0.0/24", "--bridge", "wisp0", "--pool", "128M=2"],
                                      stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "wispd.log"), "w")))
        t = time.time()
        while not os.path.exists(sock):
            if time.time() - t > 20:
                raise SystemExit("wispd did not start")
            time.sleep(0.01)
        env = dict(os.environ, WISP_SOCKET=sock)

        def run_cache():
            vid = subprocess.run([wisp, "run", "-d", "--net", "--volume", vol + ":ro", "--mem", "128M", "cache"],
                                 env=env, check=True, capture_output=True, text=True).stdout.strip()
            info = json.loads(subprocess.run([wisp, "inspect", vid], env=env, check=True, capture_output=True, text=True).stdout)
            return vid, info

        # Time from `wisp run` to the first byte, new VMs (the pool warm).
        first_ms, parts = [], []
        for _ in range(11):
            out = sh("python3", "-c", FIRST_BYTE % {"wisp": wisp, "vol": vol, "sock": sock}, ns=NS).stdout.split()
            first_ms.append(float(out[0]))
            parts.append([float(x) for x in out[2:5]])
            log("[cache] first byte %s ms: wisp run %s, address %s, to the byte %s" % tuple("%.2f" % float(x) for x in (out[0], out[2], out[3], out[4])))
            subprocess.run([wisp, "rm", "-f", out[1]], env=env, capture_output=True)
        vid, info = run_cache()
        ip = info["ip"]
        sh("python3", "-c", "import socket,time\nfor i in range(2000):\n  try:\n    socket.create_connection((%r,80),timeout=1).close(); break\n  except OSError: time.sleep(0.01)" % ip, ns=NS)
        time.sleep(1)  # idle before the memory sample
        pss = int(re.search(r"^Pss:\s*(\d+) kB", open("/proc/%d/smaps_rollup" % info["pid"]).read(), re.M).group(1))
        peers = {"wisp_cache": "http://%s" % ip, "nginx_native": "http://127.0.0.1:8081", "nginx_container": "http://10.125.0.2"}
        for name, base in peers.items():
            sh("curl", "-sf", "-o", "/dev/null", base + "/1KB", ns=NS)
        res = {p: {} for p in peers}
        for size, _ in SIZES:
            for c in CONNS:
                for p, base in peers.items():
                    log("[cache] %s %s %d connections" % (p, size, c))
                    res[p]["%s_c%d" % (size, c)] = wrk(base + "/" + size, c, args.seconds)
        thr = {}
        for p, base in peers.items():
            speeds = []
            for _ in range(3):
                out = sh("curl", "-s", "-o", "/dev/null", "-w", "%{speed_download} %{size_download}", base + "/big", ns=NS).stdout.split()
                assert int(float(out[1])) == 256 << 20, out
                speeds.append(float(out[0]) * 8 / 1e9)
            thr[p] = sorted(speeds)[1]
            log("[cache] %s 256 MB: %.2f Gbit/s" % (p, thr[p]))
        # Several cache VMs at once, one volume.
        aggregate = {}
        vms = [ip]
        for n in (1, 2, 4, 8):
            while len(vms) < n:
                _, more = run_cache()
                vms.append(more["ip"])
                wait_answer = "import socket,time\nfor i in range(2000):\n  try:\n    socket.create_connection((%r,80),timeout=1).close(); break\n  except OSError: time.sleep(0.01)" % more["ip"]
                sh("python3", "-c", wait_answer, ns=NS)
            runs = [subprocess.Popen(["ip", "netns", "exec", NS, "wrk", "-t1", "-c50", "-d%ds" % args.seconds, "http://%s/0B" % v],
                                     stdout=subprocess.PIPE, text=True) for v in vms[:n]]
            total = sum(float(re.search(r"Requests/sec:\s*([\d.]+)", r.communicate()[0]).group(1)) for r in runs)
            aggregate[str(n)] = total
            log("[cache] %d cache VMs: %.0f requests/s together" % (n, total))
        med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
        r0 = lambda p: max(res[p]["0B_c%d" % c]["rps"] for c in CONNS)  # noqa: E731
        doc = {
            "what": "the content cache VM against nginx native and nginx in a namespace container, same objects, wrk",
            "method": __doc__.strip(),
            "seconds_per_point": args.seconds,
            "rps": res,
            "throughput_256mb_gbit": thr,
            "first_byte_after_run_ms": {"runs": first_ms, "median": med(first_ms),
                                        "wisp_run_d_ms": med([x[0] for x in parts]), "address_from_api_ms": med([x[1] for x in parts]),
                                        "then_to_first_byte_ms": med([x[2] for x in parts])},
            "idle_cache_vm_pss_kb": pss,
            "aggregate_rps_0b": aggregate,
            "ratios": {
                "rps_0b_vs_nginx_native": r0("wisp_cache") / r0("nginx_native"),
                "rps_0b_vs_nginx_container": r0("wisp_cache") / r0("nginx_container"),
                "throughput_vs_nginx_native": thr["wisp_cache"] / thr["nginx_native"],
            },
            "targets": {"rps_0b_vs_nginx_native": 1.0, "rps_0b_vs_nginx_container": 1.5, "throughput_100kb_vs_nginx_native": 0.5,
                        "first_byte_ms": 5, "idle_pss_kb": 2048},
            "machine": common.machine_info(),
        }
        r100 = lambda p: max(res[p]["100KB_c%d" % c]["rps"] for c in CONNS) * 100_000 * 8 / 1e9  # noqa: E731
        doc["ratios"]["throughput_100kb_vs_nginx_native"] = r100("wisp_cache") / r100("nginx_native")
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        # (Debian's matplotlib is the system Python's.)
        common.draw(plot, doc, png, __file__, args.out)
        log(json.dumps(doc["ratios"], indent=1))
        log("first byte %.2f ms, idle PSS %d KB" % (med(first_ms), pss))
    finally:
        try:
            subprocess.run([wisp, "rm", "-f", "--all"], env=dict(os.environ, WISP_SOCKET=os.path.join(work, "wispd.sock")), capture_output=True, timeout=30)
        except Exception:
            pass
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        common.kill_pidns_holder(os.path.join(work, "state"))
        subprocess.run(["pkill", "-f", "nginx-native.conf|nginx-container.conf"], capture_output=True)
        subprocess.run(["ip", "netns", "del", CNS], capture_output=True)
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


# Run in the namespace: `wisp run -d` a cache VM, ask the API for its
# address, then ask the VM until its first byte comes; prints the
# milliseconds from before `wisp run` and the VM's id.
FIRST_BYTE = r"""
import json, os, socket, subprocess, time
env = dict(os.environ, WISP_SOCKET=%(sock)r)
t0 = time.time()
vid = subprocess.run([%(wisp)r, 'run', '-d', '--net', '--volume', %(vol)r + ':ro', '--mem', '128M', 'cache'], env=env, check=True, capture_output=True, text=True).stdout.strip()
t1 = time.time()
# The address from the API (no second CLI process in the measurement).
c = socket.socket(socket.AF_UNIX); c.connect(%(sock)r)
c.sendall(('GET /v1/vms/%%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' %% vid).encode())
resp = b''
while True:
    b = c.recv(65536)
    if not b: break
    resp += b
ip = json.loads(resp.partition(b'\r\n\r\n')[2])['ip']
t2 = time.time()
# A plain connect to the address: socket.create_connection would first run
# getaddrinfo, whose first call in a process costs ~0.8 ms here (its
# configuration read, a netlink dump of the host's addresses) — the
# client's cost, not the VM's.
while True:
    try:
        s = socket.socket()
        s.settimeout(1)
        s.connect((ip, 80))
        s.sendall(b'GET /1KB HTTP/1.1\r\nHost: x\r\n\r\n')
        if s.recv(1):
            break
    except OSError:
        time.sleep(0.0002)
t3 = time.time()
print((t3 - t0) * 1e3, vid, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)
"""

if __name__ == "__main__":
    main()
