"""Item 4 of issue 18, TLS termination (LightVM §7.3, Figure 16c): N
tenants, each with its own certificate and key (Ed25519, self-signed),
served side by side in a network namespace this benchmark makes:

- `wisp`: a `tlsproxy` VM per tenant (16 MiB, its key given with `--file`
  and in that VM only), at its own address on wispd's bridge, port 443;
- `nginx`: Debian's nginx on the host as the TLS proxy for all N tenants
  (a `server` block and a port per tenant, `worker_processes auto`: one
  worker per CPU), as a CDN would run one proxy for its customers.

The same for both: TLS 1.3 only, no session resumption (no tickets, no
cache: every connection a full handshake), the same backend (one nginx
worker answering `200 hello` on the bridge's gateway, HTTP/1.0 and a
close per request from either proxy), and the same client
(bench/tools/tlsload.c: OpenSSL, one epoll thread, max(16, N)
connections in flight round-robin over the tenants; each connects,
handshakes, sends one GET with `Connection: close` and reads the answer
to the server's close). Handshakes/s is requests completed per second
over SECONDS after a warm-up; latency is connect to the answer's last
byte. The client shares the host's two CPUs with the servers, as in
every run here: it is the same load on both sides. Run by
bench/usecases.py."""

import os
import subprocess
import time

import common
import wispapi

log = common.log
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETNS = "wbtls"
SUBNET = "10.94.0.0/23"
GW = "10.94.0.1"
BACKEND_PORT = 8080
MEM = 16 << 20
WARMUP_S = 2


def sh(args, **kw):
    return subprocess.run(args, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def make_tenants(n, d):
    """n self-signed Ed25519 certificates and keys in directory d."""
    out = []
    for i in range(n):
        cert, key = os.path.join(d, "t%d.crt" % i), os.path.join(d, "t%d.key" % i)
        if not os.path.exists(key):
            sh(["openssl", "req", "-x509", "-nodes", "-days", "30", "-newkey", "ed25519", "-subj", "/CN=t%d.test" % i,
                "-addext", "subjectAltName=DNS:t%d.test" % i, "-keyout", key, "-out", cert])
        out.append((cert, key))
    return out


def nginx_conf(path, name, body):
    with open(path, "w") as f:
        f.write("worker_processes %s;\ndaemon off;\npid %s.pid;\nerror_log %s.err;\nworker_rlimit_nofile 65536;\n"
                "events { worker_connections 8192; }\nhttp {\n  access_log off;\n%s}\n" % (name[0], name[1], name[1], body))


def start_nginx(conf):
    p = subprocess.Popen(["ip", "netns", "exec", NETNS, "nginx", "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return p


def wait_port(host, port, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = subprocess.run(["ip", "netns", "exec", NETNS, "python3", "-c",
                            "import socket; socket.create_connection(('%s', %d), timeout=1)" % (host, port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if r.returncode == 0:
            return
        time.sleep(0.05)
    raise RuntimeError("nothing listens on %s:%d" % (host, port))


def load(tool, endpoints, seconds):
    conc = max(16, len(endpoints))
    out = sh(["ip", "netns", "exec", NETNS, tool, str(WARMUP_S), str(seconds), str(conc)] + endpoints).stdout.split()
    v = dict(zip(out[0::2], out[1::2]))
    return {"handshakes_per_s": round(int(v["done"]) / float(v["seconds"]), 1), "errors": int(v["errors"]), "connections": conc,
            "p50_ms": float(v["p50_ms"]), "p90_ms": float(v["p90_ms"]), "p99_ms": float(v["p99_ms"])}


def run(args):
    levels = [int(x) for x in args.tls_tenants.split(",")]
    seconds = args.tls_seconds
    tool = common.cc(os.path.join(common.TOOLS, "tlsload.c"), os.path.join(common.BUILD, "tlsload"), libs=["-lssl", "-lcrypto"])
    work = os.path.join(common.BUILD, "tls")
    os.makedirs(work, exist_ok=True)
    tenants = make_tenants(max(levels), work)
    subprocess.run(["ip", "netns", "del", NETNS], stderr=subprocess.DEVNULL)
    sh(["ip", "netns", "add", NETNS])
    sh(["ip", "-n", NETNS, "link", "set", "lo", "up"])
    procs = []
    d = None
    results = {"wisp": [], "nginx": []}
    try:
        d = wispapi.Daemon(os.path.join(ROOT, "target/release/wispd"), os.path.join(ROOT, "build/images"), pool="16M=4", tmpfs=True,
                           extra=["--subnet", SUBNET, "--bridge", "wisp0"], netns=NETNS)
        api = d.api()
        import base64

        def b64(path):
            with open(path, "rb") as f:
                return base64.b64encode(f.read()).decode()

        # The VMs first (the bridge and its gateway address come with them).
        ips = []
        for i, (cert, key) in enumerate(tenants):
            st, r = api.call("POST", "/v1/vms", {"image": "tlsproxy", "mem": MEM, "net": True, "args": ["%s:%d" % (GW, BACKEND_PORT)],
                                                 "files": [{"path": "/cert.pem", "data": b64(cert)}, {"path": "/key.pem", "data": b64(key)}]})
            if st != 201:
                raise RuntimeError("tlsproxy %d: %s %s" % (i, st, r))
            ips.append(r["ip"])
        backend = os.path.join(work, "backend.conf")
        nginx_conf(backend, ("1", os.path.join(work, "backend")),
                   "  server { listen %s:%d; location / { return 200 \"hello\\n\"; } }\n" % (GW, BACKEND_PORT))
        procs.append(start_nginx(backend))
        wait_port(GW, BACKEND_PORT)
        servers = "".join(
            "  server { listen %s:%d ssl; ssl_certificate %s; ssl_certificate_key %s; ssl_protocols TLSv1.3; ssl_session_tickets off; "
            "ssl_session_cache off; location / { proxy_pass http://%s:%d; } }\n" % (GW, 10000 + i, cert, key, GW, BACKEND_PORT)
            for i, (cert, key) in enumerate(tenants))
        proxy = os.path.join(work, "proxy.conf")
        nginx_conf(proxy, ("auto", os.path.join(work, "proxy")), servers)
        for ip in ips:
            wait_port(ip, 443)
        for n in levels:
            for peer in ("wisp", "nginx"):
                if peer == "nginx":
                    procs.append(start_nginx(proxy))
                    wait_port(GW, 10000 + n - 1)
                    eps = ["%s:%d" % (GW, 10000 + i) for i in range(n)]
                else:
                    eps = ["%s:443" % ip for ip in ips[:n]]
                row = load(tool, eps, seconds)
                row["tenants"] = n
                results[peer].append(row)
                log("tls: %s %d tenants: %.0f handshakes/s, p50 %.1f ms, p99 %.1f ms, %d errors" % (
                    peer, n, row["handshakes_per_s"], row["p50_ms"], row["p99_ms"], row["errors"]))
                if peer == "nginx":
                    p = procs.pop()
                    p.terminate()
                    p.wait()
    finally:
        for p in procs:
            p.terminate()
            p.wait()
        if d:
            d.stop()
        subprocess.run(["ip", "netns", "del", NETNS], stderr=subprocess.DEVNULL)
    top = levels[-1]
    w = next(r for r in results["wisp"] if r["tenants"] == top)
    g = next(r for r in results["nginx"] if r["tenants"] == top)
    worst = min(a["handshakes_per_s"] / b["handshakes_per_s"] for a, b in zip(results["wisp"], results["nginx"]))
    ratios = {
        "tls_handshakes_vs_host": round(w["handshakes_per_s"] / g["handshakes_per_s"], 3),
        "tls_handshakes_vs_host_worst": round(worst, 3),
        "tls_p50_latency_vs_host": round(w["p50_ms"] / g["p50_ms"], 3),
    }
    part = {"tenants": levels, "mem": MEM, "seconds": seconds, "warmup_s": WARMUP_S, "results": results}
    note = ("tls: handshakes/s (a full TLS 1.3 handshake and one request each) with %d tenants, a tlsproxy VM each against one "
            "host nginx for all (worst: the lowest ratio over %s tenants); the client (OpenSSL, one thread) shares the two CPUs." % (top, levels))
    targets = {"tls_handshakes_vs_host": ">= 0.8", "tls_handshakes_vs_host_worst": ">= 0.8"}
    return part, ratios, note, targets


def plot(row, part):
    ax, bx = row
    for peer, style in (("wisp", "o-"), ("nginx", "s--")):
        rs = part["results"][peer]
        ax.plot([r["tenants"] for r in rs], [r["handshakes_per_s"] for r in rs], style, label=peer)
        bx.plot([r["tenants"] for r in rs], [r["p50_ms"] for r in rs], style, label=peer + " p50")
        bx.plot([r["tenants"] for r in rs], [r["p99_ms"] for r in rs], style, alpha=0.4, label=peer + " p99")
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xlabel("tenants (a VM each / one nginx)")
        a.legend(fontsize=8)
    ax.set_ylabel("handshakes/s")
    ax.set_title("TLS termination: full TLS 1.3 handshakes + a request")
    bx.set_ylabel("latency (ms)")
    bx.set_title("connect to answer, under that load")
