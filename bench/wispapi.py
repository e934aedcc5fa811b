"""Minimal wispd API client for benchmarks: HTTP/1.1 over the Unix socket,
standard library only, so the client adds as little as possible to what is
measured."""

import json
import os
import socket
import time


class Api:
    def __init__(self, path):
        self.path = path
        self.sock = None
        self.buf = b""

    def _conn(self):
        if self.sock is None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(self.path)
            self.buf = b""
        return self.sock

    def close(self):
        if self.sock:
            self.sock.close()
        self.sock = None

    def _read_more(self):
        d = self.sock.recv(65536)
        if not d:
            raise ConnectionError("wispd closed the connection")
        self.buf += d

    def _line(self):
        while b"\r\n" not in self.buf:
            self._read_more()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n:
            self._read_more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send(self, method, path, body=None):
        s = self._conn()
        data = b"" if body is None else json.dumps(body).encode()
        head = "%s %s HTTP/1.1\r\nHost: wisp\r\nContent-Length: %d\r\n" % (method, path, len(data))
        if body is not None:
            head += "Content-Type: application/json\r\n"
        s.sendall(head.encode() + b"\r\n" + data)

    def _head(self):
        status = int(self._line().split()[1])
        headers = {}
        while True:
            line = self._line()
            if not line:
                break
            k, v = line.decode().split(":", 1)
            headers[k.strip().lower()] = v.strip()
        return status, headers

    def call(self, method, path, body=None):
        """Request with a JSON answer: (status, decoded body or None)."""
        self._send(method, path, body)
        status, h = self._head()
        data = b""
        if h.get("transfer-encoding") == "chunked":
            for chunk in self._chunks():
                data += chunk
        else:
            data = self._exact(int(h.get("content-length", "0")))
        if h.get("connection", "").lower() == "close":
            self.close()
        return status, (json.loads(data) if data else None)

    def _chunks(self):
        while True:
            n = int(self._line().split(b";")[0], 16)
            if n == 0:
                self._line()
                return
            yield self._exact(n)
            self._exact(2)

    def stream(self, path):
        """GET a chunked stream; yields chunks."""
        self._send("GET", path)
        status, h = self._head()
        if status != 200:
            raise RuntimeError("GET %s: %d" % (path, status))
        yield from self._chunks()

    def first_line(self, vm_id):
        """Follow a VM's console until its first complete line; returns it."""
        got = b""
        for chunk in self.stream("/v1/vms/%s/logs?follow=true" % vm_id):
            got += chunk
            if b"\n" in got:
                break
        self.close()  # abandon the rest of the stream
        return got.split(b"\n", 1)[0]


def now_ns():
    return time.monotonic_ns()


def boot_to_first_line(api, body):
    """POST /v1/vms?attach=true and read until the first console line.
    Returns (ns from just before the request to the first line, vm id)."""
    t0 = now_ns()
    api._send("POST", "/v1/vms?attach=true", body)
    status, h = api._head()
    if status != 201:
        raise RuntimeError("create: %d" % status)
    got = b""
    t1 = None
    for chunk in api._chunks():  # read to the end: keeps the connection usable
        got += chunk
        if t1 is None and b"\n" in got:
            t1 = now_ns()
    if h.get("connection", "").lower() == "close":
        api.close()  # the VMM process answered on it, and closed it
    if t1 is None:
        raise RuntimeError("the VM printed no line")
    return t1 - t0, h.get("x-wisp-vm-id")


class Daemon:
    """A private wispd for one benchmark run (own socket and state dir)."""

    def __init__(self, wispd, images, pool="16M=8", root=None, extra=(), tmpfs=False, netns=None):
        import os
        import subprocess
        import tempfile
        self.root = root or tempfile.mkdtemp(prefix="wisp-bench-", dir="/run" if os.access("/run", os.W_OK) else None)
        # On a tmpfs of its own (`tmpfs`): where /run is on a stock Debian
        # host. (On this one /run is ext4, whose inode allocation cost each
        # VM directory ~4 ms of CPU: a benchmark that makes a VM per
        # request would measure the file system.)
        self.tmpfs = tmpfs
        if tmpfs:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", self.root], check=True)
        self.socket = os.path.join(self.root, "wispd.sock")
        self.log = open(os.path.join(self.root, "wispd.log"), "w")
        # In network namespace `netns` (a name under /run/netns), if given.
        inside = ["ip", "netns", "exec", netns] if netns else []
        self.proc = subprocess.Popen(
            inside + [wispd, "--socket", self.socket, "--state-dir", os.path.join(self.root, "state"),
             "--images", images, "--pool", pool] + list(extra),
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        deadline = time.time() + 20
        while True:
            try:
                Api(self.socket).call("GET", "/v1/version")
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("wispd did not start; see %s" % self.log.name)
                time.sleep(0.02)

    def api(self):
        return Api(self.socket)

    def ready(self, api, mem=16 << 20):
        _, p = api.call("GET", "/v1/pool")
        return sum(r["count"] for r in p["ready"] if r["mem"] == mem)

    def wait_pool(self, api, n, timeout=120):
        deadline = time.time() + timeout
        while self.ready(api) < n:
            if time.time() > deadline:
                raise RuntimeError("pool did not fill")
            time.sleep(0.005)

    def wait_group_spare(self, api, timeout=30):
        """Wait until an open group (wispd --vms-per-process) has its next
        VM prepared (GET /v1/pool's group_spares), as wait_pool waits for
        the pool's shells: the prepare phase stays off the measured path."""
        deadline = time.time() + timeout
        while True:
            _, p = api.call("GET", "/v1/pool")
            if (p or {}).get("group_spares", 0) >= 1:
                return
            if time.time() > deadline:
                raise RuntimeError("no group spare")
            time.sleep(0.0005)

    def remove_all(self):
        """Remove every VM (running ones killed), 256 per batch request
        (POST /v1/vms/remove, as `wisp rm -f --all`). Returns the seconds
        it took and how many VMs were not removed."""
        a = self.api()
        t = time.time()
        _, vms = a.call("GET", "/v1/vms")
        ids = [v["id"] for v in vms or []]
        failed = 0
        for i in range(0, len(ids), 256):
            status, r = a.call("POST", "/v1/vms/remove", {"vms": ids[i:i + 256], "force": True})
            failed += len(r.get("failed", [])) if status == 200 else len(ids[i:i + 256])
        return time.time() - t, failed

    def stop(self, remove_vms=True):
        import shutil
        if remove_vms:
            self.remove_all()
        self.proc.terminate()
        self.proc.wait()
        if remove_vms:
            # (With VMs left running, their namespace's init stays too.)
            import common
            common.kill_pidns_holder(os.path.join(self.root, "state"))
        if self.tmpfs:
            import subprocess
            # (Lazily: the last VMM processes may still be ending.)
            subprocess.run(["umount", "-l", self.root], check=False)
        shutil.rmtree(self.root, ignore_errors=True)
