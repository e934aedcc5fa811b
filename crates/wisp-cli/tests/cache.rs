//! The content cache (`cache` app) on an SHFS volume, through wispd in a
//! test-made network namespace, with real clients (curl, Python's raw
//! sockets): objects by digest and name, HEAD, ranges (one, several, none
//! satisfiable), conditional requests, errors, keep-alive and pipelining;
//! a volume that is not SHFS is refused at mount.

mod common;

use std::path::{Path, PathBuf};

use common::daemon::Daemon;
use common::{fresh_dir, wait_console, wisp};
use sha2::{Digest, Sha256};

fn sha(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

fn volume(dir: &Path, objects: &[(&str, &[u8])]) -> PathBuf {
    let v = dir.join("cache.img");
    assert_eq!(wisp(&["shfs", "mkfs", v.to_str().unwrap(), "--size", "16M", "--chunk", "4K", "--objects", "64"]).code, Some(0));
    for (name, data) in objects {
        let f = dir.join(name.trim_start_matches('/'));
        std::fs::write(&f, data).unwrap();
        let r = wisp(&["shfs", "add", v.to_str().unwrap(), f.to_str().unwrap(), "--name", name]);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
    }
    v
}

/// curl in the daemon's namespace: (status line and headers, body).
fn curl(d: &Daemon, args: &[&str]) -> (String, Vec<u8>) {
    let mut all = vec!["curl", "-s", "-S", "-D", "/dev/stderr", "--max-time", "10"];
    all.extend_from_slice(args);
    let o = d.in_netns(&all).output().unwrap();
    assert!(o.status.success(), "curl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    (String::from_utf8_lossy(&o.stderr).into_owned(), o.stdout)
}

/// Python the tests' scripts share: `read_all(s)`, a response read until
/// the server closes, split into its head and body.
const PY_READ_ALL: &str = r#"
def read_all(s):
    out = b''
    while True:
        b = s.recv(65536)
        if not b: break
        out += b
    head, _, body = out.partition(b'\r\n\r\n')
    return head, body
"#;

/// A cache VM serving a volume of `objects`, on a daemon of its own in a
/// test-made namespace (`subnet`), run with `args` before the image; it
/// serves once this returns.
struct CacheVm {
    dir: PathBuf,
    vol: PathBuf,
    d: Daemon,
    id: String,
}

impl CacheVm {
    fn start(tag: &str, subnet: &str, objects: &[(&str, &[u8])], args: &[&str]) -> CacheVm {
        let dir = fresh_dir(tag);
        let vol = volume(&dir, objects);
        let d = Daemon::start_in_netns(tag, subnet, &[]);
        let spec = args.iter().map(|a| a.replace("VOLUME", vol.to_str().unwrap())).collect::<Vec<_>>();
        let mut argv = vec!["run", "-d", "--net"];
        argv.extend(spec.iter().map(String::as_str));
        argv.push("cache");
        let id = String::from_utf8_lossy(&d.wisp(&argv).stdout).trim().to_string();
        let mut c = d.client();
        wait_console(&mut c, &id, &format!("cache: serving {} objects", objects.len()));
        CacheVm { dir, vol, d, id }
    }

    /// The VM's address on the daemon's bridge.
    fn ip(&self) -> String {
        let info = String::from_utf8_lossy(&self.d.wisp(&["inspect", &self.id]).stdout).to_string();
        info.split("\"ip\": \"").nth(1).and_then(|r| r.split('"').next()).expect("the VM's address").to_string()
    }
}

impl Drop for CacheVm {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn the_cache_serves_a_volume_as_http_says() {
    let dir = fresh_dir("cache-http");
    let page = b"<h1>hello cache</h1>\n".to_vec();
    let blob: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let v = volume(&dir, &[("/index.html", &page), ("/blob.bin", &blob)]);
    let d = Daemon::start_in_netns("cache-http", "10.77.32.0/24", &[]);
    let vol = format!("{}:ro", v.display());
    let out = d.wisp(&["run", "-d", "--net", "-p", "8080:80", "--volume", &vol, "--mem", "64M", "cache"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut c = d.client();
    wait_console(&mut c, &id, "cache: serving 2 objects on 10.77.32.");
    let url = |p: &str| format!("http://127.0.0.1:8080{p}");
    // By name and by digest; the headers a cache sends.
    let (h, body) = curl(&d, &[&url("/index.html")]);
    assert_eq!(body, page);
    assert!(h.starts_with("HTTP/1.1 200 OK"), "{h}");
    let etag = format!("ETag: \"{}\"", sha(&page));
    for want in [etag.as_str(), "Content-Type: text/html", "Cache-Control: public, max-age=3600", "Accept-Ranges: bytes", "Last-Modified: "] {
        assert!(h.contains(want), "{want}: {h}");
    }
    let (_, body) = curl(&d, &[&url(&format!("/{}", sha(&blob)))]);
    assert!(body == blob, "the 300 KB object came back changed ({} bytes)", body.len());
    // HEAD: the head alone.
    let (h, body) = curl(&d, &["-I", &url("/blob.bin")]);
    assert!(h.contains("Content-Length: 300000") && body.is_empty() || String::from_utf8_lossy(&body).contains("300000"), "{h}");
    // One range, several ranges, none satisfiable.
    let (h, body) = curl(&d, &["-r", "100-199", &url("/blob.bin")]);
    assert!(h.starts_with("HTTP/1.1 206") && h.contains("Content-Range: bytes 100-199/300000"), "{h}");
    assert_eq!(body, &blob[100..200]);
    let (h, body) = curl(&d, &["-r", "0-9,290000-290009", &url("/blob.bin")]);
    assert!(h.contains("Content-Type: multipart/byteranges; boundary="), "{h}");
    let text = String::from_utf8_lossy(&body).into_owned();
    assert!(text.contains("Content-Range: bytes 0-9/300000") && text.contains("Content-Range: bytes 290000-290009/300000"), "{text}");
    let (h, _) = curl(&d, &["-r", "400000-", &url("/blob.bin")]);
    assert!(h.starts_with("HTTP/1.1 416") && h.contains("Content-Range: bytes */300000"), "{h}");
    // Conditional requests.
    let inm = format!("If-None-Match: \"{}\"", sha(&page));
    let (h, body) = curl(&d, &["-H", &inm, &url("/index.html")]);
    assert!(h.starts_with("HTTP/1.1 304") && body.is_empty(), "{h}");
    let (h, _) = curl(&d, &["-H", "If-Modified-Since: Fri, 01 Jan 2100 00:00:00 GMT", &url("/index.html")]);
    assert!(h.starts_with("HTTP/1.1 304"), "{h}");
    let (h, _) = curl(&d, &["-H", "If-Modified-Since: Thu, 01 Jan 1970 00:00:00 GMT", &url("/index.html")]);
    assert!(h.starts_with("HTTP/1.1 200"), "{h}");
    // Errors.
    let (h, _) = curl(&d, &[&url("/missing")]);
    assert!(h.starts_with("HTTP/1.1 404"), "{h}");
    let (h, _) = curl(&d, &["-X", "POST", &url("/index.html")]);
    assert!(h.starts_with("HTTP/1.1 405") && h.contains("Allow: GET, HEAD"), "{h}");
    // Pipelining and keep-alive on one connection; then oversized and
    // malformed requests (each answered, then the connection closed).
    let script = r#"
import socket
def talk(data):
    s = socket.create_connection(('127.0.0.1', 8080), timeout=10)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    out = b''
    while True:
        b = s.recv(65536)
        if not b: break
        out += b
    return out
two = talk(b'GET /index.html HTTP/1.1\r\nHost: x\r\n\r\nHEAD /index.html HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
print(two.count(b'HTTP/1.1 200 OK'), two.count(b'<h1>hello cache</h1>'))
print(talk(b'GET /' + b'a' * 9000 + b' HTTP/1.1\r\n').split(b'\r\n')[0].decode())
print(talk(b'GET / HTTP/1.1\r\n' + b''.join(b'X-%d: y\r\n' % i for i in range(100)) + b'\r\n').split(b'\r\n')[0].decode())
print(talk(b'GET / HTTP/1.1\r\nX: ' + b'y' * 20000 + b'\r\n\r\n').split(b'\r\n')[0].decode())
print(talk(b'\x00\x01 garbage\r\n\r\n').split(b'\r\n')[0].decode())
"#;
    let out = d.python(script);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, ["2 1", "HTTP/1.1 414 URI Too Long", "HTTP/1.1 431 Request Header Fields Too Large", "HTTP/1.1 431 Request Header Fields Too Large", "HTTP/1.1 400 Bad Request"], "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_volume_that_is_not_shfs_is_refused_at_mount() {
    let dir = fresh_dir("cache-bad");
    let v = dir.join("zero.img");
    std::fs::write(&v, vec![0u8; 1 << 20]).unwrap();
    let d = Daemon::start_in_netns("cache-bad", "10.77.33.0/24", &[]);
    let vol = format!("{}:ro", v.display());
    let out = d.wisp(&["run", "--net", "--volume", &vol, "cache"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cache: cannot mount the volume: not an SHFS volume"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An origin server in the daemon's namespace, on the bridge's gateway
/// address: `/big.bin` (400 KB, sent in paced pieces), `/short.bin`
/// (announces 1 MB, sends 100 KB, closes), `/hang` (never answers),
/// `/count/<path>` (how often `<path>` was asked for).
const ORIGIN: &str = r#"
import http.server, socketserver, sys, threading, time
counts = {}
BIG = bytes((i * 13) % 251 for i in range(400_000))
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path.startswith('/count/'):
            body = str(counts.get(self.path[6:], 0)).encode()
            self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body); return
        counts[self.path] = counts.get(self.path, 0) + 1
        if self.path == '/big.bin':
            self.send_response(200); self.send_header('Content-Length', str(len(BIG))); self.send_header('Content-Type', 'video/mp4'); self.end_headers()
            for i in range(0, len(BIG), 40_000):
                self.wfile.write(BIG[i:i + 40_000]); self.wfile.flush(); time.sleep(0.03)
        elif self.path == '/short.bin':
            self.send_response(200); self.send_header('Content-Length', '1000000'); self.end_headers()
            self.wfile.write(b'x' * 100_000); self.wfile.flush()
        elif self.path == '/hang':
            time.sleep(30)
        else:
            self.send_response(404); self.end_headers()
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
S((sys.argv[1], 8000), H).serve_forever()
"#;

#[test]
fn links_are_fetched_once_streamed_to_every_client_and_stored() {
    let dir = fresh_dir("cache-up");
    let v = volume(&dir, &[]);
    let vs = v.to_str().unwrap();
    for (name, path) in [("/big.bin", "big.bin"), ("/short.bin", "short.bin"), ("/hang", "hang"), ("/down", "down")] {
        let port = if name == "/down" { 8001 } else { 8000 };
        let url = format!("http://10.77.34.1:{port}/{path}");
        assert_eq!(wisp(&["shfs", "add", vs, "--link", &url, "--name", name]).code, Some(0));
    }
    let d = Daemon::start_in_netns("cache-up", "10.77.34.0/24", &[]);
    // The cache first: its NIC makes the bridge the origin listens on.
    let out = d.wisp(&["run", "-d", "--net", "-p", "8080:80", "--volume", vs, "--mem", "64M", "-e", "CACHE_UPSTREAM_TIMEOUT_MS=1500", "cache"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut c = d.client();
    wait_console(&mut c, &id, "cache: serving 4 objects");
    let mut origin = d.in_netns(&["python3", "-c", ORIGIN, "10.77.34.1"]).spawn().unwrap();
    let up = "import socket,time\nfor i in range(500):\n  try:\n    socket.create_connection(('10.77.34.1',8000),timeout=1).close(); print('up'); break\n  except OSError: time.sleep(0.02)";
    assert_eq!(d.python(up).trim(), "up", "the origin did not start");
    let big: Vec<u8> = (0..400_000u32).map(|i| (i * 13 % 251) as u8).collect();
    // Four clients at once: one upstream read, four whole bodies.
    let script = r#"
import socket, threading, hashlib
res = []
def get():
    s = socket.create_connection(('127.0.0.1', 8080), timeout=20)
    s.sendall(b'GET /big.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
    head, body = read_all(s)
    res.append((head.split(b'\r\n')[0].decode(), b'X-Cache: miss' in head, hashlib.sha256(body).hexdigest()))
ts = [threading.Thread(target=get) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
for r in sorted(res): print(*r)
"#;
    let got = d.python(&(PY_READ_ALL.to_string() + script));
    let want = format!("HTTP/1.1 200 OK True {}", sha(&big));
    let stderr = || String::from_utf8_lossy(&d.wisp(&["logs", "--stderr", &id]).stdout).into_owned();
    assert_eq!(got.lines().collect::<Vec<_>>(), [want.as_str(); 4], "{got} (the cache said: {})", stderr());
    let count = |p: &str| curl(&d, &[&format!("http://10.77.34.1:8000/count{p}")]).1;
    assert_eq!(count("/big.bin"), b"1", "one upstream read for four clients");
    // Stored: served from the volume now, with ranges; fsck is clean.
    let (h, body) = curl(&d, &["-r", "1000-1999", "http://127.0.0.1:8080/big.bin"]);
    assert!(h.starts_with("HTTP/1.1 206") && !h.contains("X-Cache: miss"), "{h}");
    assert_eq!(body, &big[1000..2000]);
    assert_eq!(count("/big.bin"), b"1");
    let ls = wisp(&["shfs", "ls", vs]).stdout;
    assert!(ls.lines().any(|l| l.contains("/big.bin") && l.contains(" 400000 ")), "{ls}");
    assert_eq!(wisp(&["shfs", "fsck", vs]).code, Some(0));
    // Failures: nothing listening (502), no answer (504), a body cut short
    // (the connection closes; nothing stored: the next request fetches again).
    let (h, _) = curl(&d, &["http://127.0.0.1:8080/down"]);
    assert!(h.starts_with("HTTP/1.1 502"), "{h}");
    let (h, _) = curl(&d, &["http://127.0.0.1:8080/hang"]);
    assert!(h.starts_with("HTTP/1.1 504"), "{h}");
    let o = d.in_netns(&["curl", "-s", "-o", "/dev/null", "-w", "%{size_download}", "--max-time", "10", "http://127.0.0.1:8080/short.bin"]).output().unwrap();
    assert!(!o.status.success(), "a cut body must not look complete");
    let _ = d.in_netns(&["curl", "-s", "-o", "/dev/null", "--max-time", "10", "http://127.0.0.1:8080/short.bin"]).output();
    assert_eq!(count("/short.bin"), b"2", "a failed fetch is not stored");
    let ls = wisp(&["shfs", "ls", vs]).stdout;
    assert!(ls.lines().any(|l| l.contains("/short.bin") && l.contains(" link          0 ")), "{ls}");
    let _ = origin.kill();
    let _ = origin.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_operator_shell_works_on_the_console_and_over_http_for_admins_only() {
    let dir = fresh_dir("cache-shell");
    let page = b"<p>shell</p>\n".to_vec();
    let v = volume(&dir, &[("/page.html", &page)]);
    let vs = v.to_str().unwrap();
    let d = Daemon::start_in_netns("cache-shell", "10.77.36.0/24", &[]);
    // The console: commands on standard input, answers on standard output.
    let input = "help\nls\nadd http://10.77.36.1:9/x.bin /x.bin\nls\nrm /x.bin\nuptime\nbogus\nhalt\n";
    let r = common::wisp_input(
        &["run", "-i", "--net", "--volume", vs, "cache"],
        &[("WISP_SOCKET", &d.socket)],
        Some(input.as_bytes().to_vec()),
        std::time::Duration::from_secs(30),
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let out = r.stdout;
    assert!(out.contains("commands: ls, stats, info, add URL [NAME], rm OBJECT, purge OBJECT, uptime, halt"), "{out}");
    assert!(out.contains(&format!("{} file 13 /page.html hits 0", sha(&page))), "{out}");
    assert!(out.contains(&format!("added {}", sha(b"http://10.77.36.1:9/x.bin"))) && out.contains("link 0 /x.bin"), "{out}");
    assert!(out.contains("removed ") && out.contains("up ") && out.contains("unknown command 'bogus'"), "{out}");
    assert!(out.contains("halting (statistics of 1 objects saved)"), "{out}");
    // Over HTTP: refused to others, served to CACHE_ADMIN addresses (the
    // host's forwards come from the bridge's address).
    let out = d.wisp(&["run", "-d", "--net", "-p", "8080:80", "--volume", vs, "-e", "CACHE_ADMIN=10.77.36.1", "cache"]);
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut c = d.client();
    wait_console(&mut c, &id, "cache: serving 1 objects");
    for _ in 0..3 {
        assert_eq!(curl(&d, &["http://127.0.0.1:8080/page.html"]).1, page);
    }
    let (h, body) = curl(&d, &["-X", "POST", "--data", "stats", "http://127.0.0.1:8080/.shell"]);
    assert!(h.starts_with("HTTP/1.1 200"), "{h}");
    assert!(String::from_utf8_lossy(&body).starts_with("requests 4 hits 3 misses 0 bytes 39 objects 1"), "{}", String::from_utf8_lossy(&body));
    let (h, body) = curl(&d, &["-X", "PURGE", "http://127.0.0.1:8080/page.html"]);
    assert!(h.starts_with("HTTP/1.1 200") && String::from_utf8_lossy(&body).starts_with("purged"), "{h}");
    let (h, _) = curl(&d, &["-X", "POST", "--data", "halt", "http://127.0.0.1:8080/.shell"]);
    assert!(h.starts_with("HTTP/1.1 200"), "{h}");
    assert_eq!(c.wait(&id).unwrap().code, 0);
    assert_eq!(wisp(&["shfs", "fsck", vs]).code, Some(0));
    // Not an admin: 403, for the shell and PURGE alike.
    let out = d.wisp(&["run", "-d", "--net", "-p", "8081:80", "--volume", &format!("{vs}:ro"), "cache"]);
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    wait_console(&mut c, &id, "cache: serving 1 objects");
    for args in [["-X", "POST", "--data", "halt", "http://127.0.0.1:8081/.shell"], ["-X", "PURGE", "", "", "http://127.0.0.1:8081/page.html"]] {
        let args: Vec<&str> = args.into_iter().filter(|a| !a.is_empty()).collect();
        let (h, _) = curl(&d, &args);
        assert!(h.starts_with("HTTP/1.1 403"), "{h}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn slow_and_vanishing_clients_cost_the_cache_nothing() {
    let blob: Vec<u8> = (0..2_000_000u32).map(|i| (i % 241) as u8).collect();
    let args = ["-p", "8080:80", "--volume", "VOLUME:ro", "--mem", "64M", "-e", "CACHE_REQUEST_TIMEOUT_MS=500"];
    let vm = CacheVm::start("cache-slow", "10.77.37.0/24", &[("/blob.bin", &blob)], &args);
    // A slowloris head is answered 408 and closed by the request timeout;
    // clients that vanish mid-body leave the cache serving the others.
    let script = r#"
import socket, time
s = socket.create_connection(('127.0.0.1', 8080), timeout=10)
s.sendall(b'GET /blob.bin HTTP/1.1\r\nHost: x\r\nX-Slow: ')
t = time.time(); out = b''
while True:
    b = s.recv(4096)
    if not b: break
    out += b
print(out.split(b'\r\n')[0].decode(), round(time.time() - t) < 5)
for _ in range(20):
    s = socket.create_connection(('127.0.0.1', 8080), timeout=10)
    s.sendall(b'GET /blob.bin HTTP/1.1\r\nHost: x\r\n\r\n')
    s.recv(10000)
    s.close()
s = socket.create_connection(('127.0.0.1', 8080), timeout=10)
s.sendall(b'GET /blob.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
out = b''
while True:
    b = s.recv(65536)
    if not b: break
    out += b
print(len(out.partition(b'\r\n\r\n')[2]))
"#;
    let got = vm.d.python(script);
    assert_eq!(got.lines().collect::<Vec<_>>(), ["HTTP/1.1 408 Request Timeout True", "2000000"], "{got}");
}

#[test]
fn clients_with_a_small_mss_get_every_byte() {
    // smoltcp builds TCP segments of up to 64 KiB for the host to cut at
    // the peer's MSS; at 536 (a peer without the option) that is more
    // segments than the ABI lets one frame carry, and at 88 (Linux's
    // least) nearly 800: the library OS splits those itself, and the
    // monitor, which refuses such frames, never sees one.
    let blob: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let vm = CacheVm::start("cache-mss", "10.77.38.0/24", &[("/blob.bin", &blob)], &["--volume", "VOLUME:ro", "--mem", "64M"]);
    // Straight to the VM's address (a port forwarded by the host would
    // give the VM the host's MSS, not the client's).
    let ip = vm.ip();
    let script = r#"
import hashlib, socket
for mss in (536, 88, 0):
    s = socket.socket()
    if mss:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, mss)
    s.settimeout(20)
    s.connect((VM_ADDRESS, 80))
    s.sendall(b'GET /blob.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
    print(mss, hashlib.sha256(read_all(s)[1]).hexdigest())
"#;
    let got = vm.d.python(&(PY_READ_ALL.to_string() + &script.replace("VM_ADDRESS", &format!("{ip:?}"))));
    let want = sha(&blob);
    assert_eq!(got.lines().collect::<Vec<_>>(), [format!("536 {want}"), format!("88 {want}"), format!("0 {want}")], "{got}");
}

#[test]
fn thousands_of_connections_are_held_at_once() {
    // 2,000 clients connected together, each then asking for an object:
    // the later ones get smaller socket buffers (the library OS shares the
    // heap out), none is refused, and the VM lives on.
    let blob: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    let vm = CacheVm::start("cache-many", "10.77.39.0/24", &[("/o", &blob)], &["--volume", "VOLUME:ro", "--mem", "128M"]);
    let ip = vm.ip();
    let script = r#"
import hashlib, resource, socket
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(8192, hard), hard))
conns = []
for i in range(2000):
    s = socket.create_connection((VM_ADDRESS, 80), timeout=20)
    conns.append(s)
for s in conns:
    s.sendall(b'GET /o HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
good = set()
for s in conns:
    head, body = read_all(s)
    s.close()
    good.add((head.split(b'\r\n')[0].decode(), hashlib.sha256(body).hexdigest()))
print(len(conns), sorted(good))
"#;
    let got = vm.d.python(&(PY_READ_ALL.to_string() + &script.replace("VM_ADDRESS", &format!("{ip:?}"))));
    assert_eq!(got.trim(), format!("2000 [('HTTP/1.1 200 OK', '{}')]", sha(&blob)), "{got}");
}

#[test]
fn statistics_are_written_back_while_the_cache_runs() {
    let page = b"<p>counted</p>\n".to_vec();
    let vm = CacheVm::start("cache-stats", "10.77.40.0/24", &[("/page.html", &page)], &["-p", "8080:80", "--volume", "VOLUME", "-e", "CACHE_STATS_SECONDS=1"]);
    for _ in 0..3 {
        let (head, body) = curl(&vm.d, &["http://127.0.0.1:8080/page.html"]);
        assert!(head.starts_with("HTTP/1.1 200 OK") && body == page, "{head}");
    }
    // The host tool reads the volume while the VM runs: within a few
    // write-back periods it shows the three hits and the bytes served.
    let want = format!("hits 3 misses 0 served {}", 3 * page.len());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let ls = wisp(&["shfs", "ls", "--stats", vm.vol.to_str().unwrap()]).stdout;
        if ls.contains(&want) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not written back: {ls}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
