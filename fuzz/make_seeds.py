#!/usr/bin/env python3
"""Regenerate the seed corpora in fuzz/corpus/ (run from the repository root after `make guest`).

Seeds are small real inputs: bundled images, requests from the HTTP tests, a response of each body
kind, manifests, family call blocks. The fuzzers add what they find to the same directories when
they run; only these seeds are committed."""
import hashlib, os, struct, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
ABI = 4  # wisp_abi::ABI_VERSION

def put(target, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    name = "seed-" + hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

# 1. Images: the smallest bundled ones (noop, hello, and daytime for a NIC in the manifest).
for img in ["noop", "hello", "daytime"]:
    p = os.path.join(ROOT, "build", "images", img)
    if os.path.exists(p):
        put("image_parse", open(p, "rb").read())
    else:
        print(f"warning: {p} missing (run `make guest`)", file=sys.stderr)

# 2. Requests (from crates/wisp-api/src/http/tests.rs and the API table).
REQUESTS = [
    b"GET /v1/vms/a%20b%2Fc?name=hello+world%21&flag&&x=%E2%9C%93 HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    b"GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\n\r\n",
    b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\n{\"a\": 1}\n",
    b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"POST /v1/vms?a=b%20c&d HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\nhello",
    b"GET /v1/vms/%E2%9C%93 HTTP/1.0\nConnection: keep-alive\n\n",
    b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
]
def req(method, target, body=None):
    head = f"{method} {target} HTTP/1.1\r\nHost: x\r\n".encode()
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
    return head + b"\r\n" + (body or b"")
API = [
    req("GET", "/v1/version"),
    req("GET", "/v1/vms"),
    req("POST", "/v1/vms?attach=true", b'{"image":"hello","args":["a","b"],"mem":67108864,"name":"s1","timeout_ms":1000,'
        b'"net":true,"ports":[{"host":8013,"vm":13,"addr":"127.0.0.1"}],"net_rate":{"bytes_per_sec":1000000}}'),
    req("GET", "/v1/vms/s1"),
    req("POST", "/v1/vms/s1/pause", b""),
    req("POST", "/v1/vms/123/stop", b'{"grace_ms":1500}'),
    req("GET", "/v1/vms/s1/logs?follow=true"),
    req("DELETE", "/v1/vms/s1?force=true"),
    req("PUT", "/v1/pool", b'{"target":[{"mem":67108864,"count":4}]}'),
]
for r in REQUESTS + API:
    put("http_request", b"\x00" + r)
for r in REQUESTS[:3]:
    put("http_request", b"\x47" + r)  # 7-byte buffer, read_request_with
for r in API:
    put("api_action", b"\x00" + r)
put("api_action", b"\x03/v1/vms\xffattach\xfftrue\xff{\"image\":\"noop\"}")
put("api_action", b"\x01/v1/vms/x/logs\xfffollow\xfftrue")

# Responses (client side): Content-Length, chunked, until EOF, an error, a 204.
RESPONSES = [
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{"version":"1"}',
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nX-Wisp-Vm-Id: 42\r\n\r\n5\r\nhello\r\n3;x=y\r\nabc\r\n0\r\nTrailer: t\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil eof",
    b'HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 24\r\n\r\n{"error":"no such vm x"}',
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffff\r\nab",
]
for r in RESPONSES:
    put("http_response", b"\x00" + r)   # GET, request()
    put("http_response", b"\x08" + r)   # GET, stream()
put("http_response", b"\x02" + RESPONSES[0])  # HEAD
put("http_response", b"\x05" + RESPONSES[1])  # POST with a body

# 3. Boot arguments (0xff separates arguments) and a raw page.
put("boot_args", b"hello\xffa\xffb")
put("boot_args", b"kvstore\xff6380\xff10")
put("boot_args", b"x" * 2100)
put("boot_args", b"a\x00b\xffc")
page = struct.pack("<Q", int.from_bytes(b"WISPBOOT", "little")) + struct.pack("<II", ABI, 1) + b"\x00" * 80
page += struct.pack("<II", 3, 12) + b"hello\x00a\x00b\x00\x00"
put("boot_args", page)

# Manifests (ImageNote descriptors): none, fork+family, a required NIC.
def note(version, features, devices):
    b = struct.pack("<IIII", version, len(devices), features & 0xffffffff, features >> 32)
    for kind, flags, name in devices + [(0, 0, b"")] * (8 - len(devices)):
        b += struct.pack("<II", kind, flags) + name.ljust(16, b"\x00")
    return b
put("image_note", note(ABI, 0, []))
put("image_note", note(ABI, 3, []))
put("image_note", note(ABI, 0, [(1, 1, b"net0")]))
put("image_note", note(1, 0, []))
put("image_note", note(ABI, 1 << 40, [(1, 0, b"net0"), (9, 1, b"x" * 16)]))

# 4. Family call blocks: pipe, write, read, close; msgget/snd/rcv/rmid; shmget/at/dt; wait; kill.
def call(op, flags=0, a=(0, 0, 0, 0)):
    return struct.pack("<II4QqQQ", op, flags, *a, 0, 0, 0)
NOWAIT = 1
put("family_call", call(1) + call(4, NOWAIT, (4, 0x1000, 64, 0)) + call(3, NOWAIT, (3, 0x2000, 64, 0)) + call(2, 0, (3, 0, 0, 0)))
put("family_call", call(7, 0, (42, 0o1000, 0, 0)) + call(8, NOWAIT, (256, 0x1000, 100, 5)) + call(9, NOWAIT, (256, 0x2000, 100, 0)) + call(10, 0, (256, 0, 0, 0)))
put("family_call", call(11, 0, (7, 0o1000, 8192, 0)) + call(12, 0, (256, 0, 0, 0)) + call(13, 0, (0x40000000, 0, 0, 0)) + call(14, 0, (256, 0, 0, 0)))
put("family_call", call(0) + call(6, NOWAIT, (2**64 - 1, 0, 0, 0)) + call(15) + call(5, 0, (1, 10, 0, 0)))

# 5. NIC rings (fuzz_targets/nic_ring.rs): setup (layout | offload bits, cut, TX/RX frames/s and
# KiB/s, start index), then operations. 3: a guest's send (kind: 0 IPv4, 1 ARP, 2 IPv6; +4 another
# MAC, +8 another address; +16 a TCP super-frame, +32 of one segment, +64 one header field changed),
# 4: a TX pass, 5: an RX pass with frames and headers, 6: the guest takes RX slots, 7: time.
def setup(layout=0, cut=0, tx=(0, 0), rx=(0, 0), start=0):
    return struct.pack("<BHBBBBB", layout, cut, tx[0], tx[1], rx[0], rx[1], start)
def send(kind, length, fill=b"\x11"):
    return struct.pack("<BBH", 3, kind, length - 1) + (fill * 64)[:min(length, 64)]
def tso(payload, size_less=0, bad=None, plain=False):
    kind = 16 | (32 if plain else 0) | (64 if bad else 0)
    out = struct.pack("<BBH", 3, kind, payload - 1)
    if not plain:
        out += struct.pack("<B", size_less)
    out += b"\x22" * 64
    if bad:
        out += struct.pack("<HB", bad[1], bad[0])  # value, field (0 flags .. 5 csum_offset)
    return out
def rx_pass(*frames, gso=(0, 0, 0)):
    out = struct.pack("<BB", 5, len(frames))
    for f in frames:
        out += struct.pack("<H", len(f)) + f[:64] + struct.pack("<HBB", gso[0], gso[1], gso[2])
    return out
TX, TAKE, TICK = b"\x04", lambda k: struct.pack("<BB", 6, k), lambda ms: struct.pack("<BH", 7, ms)
POKE = lambda field, v: struct.pack("<BBI", 0, field, v)          # 0 RX_PROD 1 RX_CONS 2 TX_PROD 3 TX_CONS
def DESC(slot, raw, big=None, vnet=(0, 0, 0, 0, 0, 0)):
    out = struct.pack("<BBH", 1, slot, raw)
    if raw & 0x8000:
        out += struct.pack("<I", big)
    return out + struct.pack("<BBHHHHH", *vnet, 0)
eth = b"\xff" * 6 + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00" + b"\x45" + b"\x00" * 40
put("nic_ring", setup() + send(0, 60) + send(1, 42) + send(0, 1514) + TX + rx_pass(eth, eth * 2) + TAKE(2) + TX)
put("nic_ring", setup(tx=(20, 0), rx=(20, 4)) + send(0, 100) * 5 + TX + TICK(50) + TX + rx_pass(eth, eth, eth) + TICK(100) + rx_pass(eth))
put("nic_ring", setup() + send(4, 60) + send(8, 60) + send(2, 80) + send(1 | 8, 42) + send(3, 30) + send(0, 1514) + TX)
put("nic_ring", setup() + POKE(2, 1000) + TX)
put("nic_ring", setup() + DESC(0, 0x8000, big=0xffffffff) + POKE(2, 1) + TX)
put("nic_ring", setup(start=1) + send(0, 60) * 3 + TX + rx_pass(eth, eth, eth) + TAKE(3) + rx_pass(eth))
put("nic_ring", setup(layout=2, cut=0x8000) + send(0, 60) + TX + rx_pass(*[eth] * 40) + TAKE(40) + rx_pass(eth))
put("nic_ring", setup(layout=1) + send(0, 64) + TX + POKE(1, 7) + rx_pass(eth))
# Offloads: super-frames (through the ring's end with start=20), one-segment and plain checksum
# requests, each header field changed, offloads off, chains past tx_prod, RX super-frames, budgets.
put("nic_ring", setup(start=20) + tso(14480) + tso(65495) + tso(1000) + tso(1400, plain=True) + TX)
for field, value in [(0, 0x81), (1, 5), (2, 53), (3, 9000), (4, 35), (5, 6)]:
    put("nic_ring", setup() + tso(14480) + tso(14480, bad=(field, value)) + TX)
put("nic_ring", setup(layout=4) + tso(14480) + TX)
put("nic_ring", setup(layout=4 | 8) + tso(1000, plain=True) + tso(14480) + TX)
put("nic_ring", setup() + DESC(0, 20000, vnet=(1, 1, 54, 1448, 34, 16)) + POKE(2, 3) + TX)
put("nic_ring", setup(tx=(20, 100), rx=(20, 100)) + tso(60000) * 3 + TX + TICK(2000) + TX + rx_pass(eth * 100, eth, gso=(1448, 1, 1)) + TICK(500) + rx_pass(eth))
