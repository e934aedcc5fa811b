//! TLS termination (`guest/apps/tlsproxy`, issue 18 item 4): a VM per
//! tenant ends TLS 1.3 with that tenant's key, given to it with `--file`
//! through wispd, and relays the plaintext to a backend on the daemon's
//! bridge — driven by Debian's curl and OpenSSL, in the daemon's own
//! network namespace. Garbage in the handshake is refused without taking
//! the proxy down, a backend that refuses ends the client's connection
//! cleanly; a missing or bad certificate or key, or a bad backend address,
//! is refused at start with why.

mod common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use common::{console, fresh_dir, wait_console};

fn out(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The backend: on port 8080, for each connection, one HTTP/1.0 request;
/// `/big` answers 300,000 bytes of a known pattern, anything else the
/// SHA-256 of the request's body and its path. On port 8081 an echo
/// service (each byte back as it comes, with small socket buffers). Binds
/// every address of the namespace.
const BACKEND: &str = r#"
import hashlib, socket, threading
def serve(c):
    try:
        b = b''
        while b'\r\n\r\n' not in b:
            d = c.recv(65536)
            if not d: return
            b += d
        head, body = b.split(b'\r\n\r\n', 1)
        lines = head.decode().split('\r\n')
        path = lines[0].split(' ')[1]
        n = 0
        for l in lines[1:]:
            k, _, v = l.partition(':')
            if k.strip().lower() == 'content-length': n = int(v)
        while len(body) < n:
            d = c.recv(65536)
            if not d: break
            body += d
        if path == '/big':
            out = bytes((i * 7) % 251 for i in range(300000))
        else:
            out = (hashlib.sha256(body).hexdigest() + ' ' + path).encode()
        c.sendall(b'HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n' % len(out) + out)
    finally:
        c.close()
def echo(c):
    # Small buffers: its sends block soon when the proxy does not read.
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        while True:
            d = c.recv(65536)
            if not d: break
            c.sendall(d)
    finally:
        c.close()
def listen(port, handler):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(('0.0.0.0', port))
    s.listen(64)
    def loop():
        while True:
            c, _ = s.accept()
            threading.Thread(target=handler, args=(c,), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()
listen(8080, serve)
listen(8081, echo)
print('ready', flush=True)
threading.Event().wait()
"#;

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The backend, started in the daemon's namespace; returns once it listens.
fn backend(d: &Daemon) -> Killed {
    use std::io::BufRead;
    let mut child = d.in_netns(&["python3", "-c", BACKEND]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "the backend did not start");
    Killed(child)
}

/// A self-signed certificate for `name` and its key (`ed25519` or `ec`
/// P-256), as PEM files in `dir`: (cert, key).
fn tenant(dir: &std::path::Path, name: &str, kind: &str) -> (String, String) {
    let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["req", "-x509", "-nodes", "-days", "2", "-subj"]).arg(format!("/CN={name}"));
    cmd.arg("-addext").arg(format!("subjectAltName=DNS:{name}"));
    match kind {
        "ed25519" => cmd.args(["-newkey", "ed25519"]),
        _ => cmd.args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]),
    };
    let o = cmd.arg("-keyout").arg(&key).arg("-out").arg(&cert).output().expect("openssl (apt install openssl)");
    assert!(o.status.success(), "openssl req: {}", out(&o));
    (cert.to_str().unwrap().to_string(), key.to_str().unwrap().to_string())
}

/// Start a tlsproxy for a tenant; its id and address.
fn start(d: &Daemon, name: &str, cert: &str, key: &str) -> (String, String) {
    start_with(d, name, cert, key, "10.77.43.1:8080")
}

/// As [`start`], relaying to `backend`.
fn start_with(d: &Daemon, name: &str, cert: &str, key: &str, backend: &str) -> (String, String) {
    let o = d.wisp(&["run", "-d", "--net", "--name", name, "--file", &format!("{cert}:/cert.pem"), "--file", &format!("{key}:/key.pem"), "tlsproxy", "--", backend]);
    assert!(o.status.success(), "{}", out(&o));
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let mut c = d.client();
    wait_console(&mut c, &id, "tlsproxy: listening on ");
    let said = console(&mut c, &id);
    let ip = said.split("listening on ").nth(1).unwrap().split(':').next().unwrap().to_string();
    (id, ip)
}

/// Stop VM `id` and give its console once it printed its counters.
fn stop_for_counters(d: &Daemon, id: &str) -> String {
    let o = d.wisp(&["stop", id]);
    assert!(o.status.success(), "{}", out(&o));
    let mut c = d.client();
    common::eventually(Duration::from_secs(20), || format!("{id} printed no counters"), || console(&mut c, id).contains("tlsproxy: counters").then_some(()));
    console(&mut c, id)
}

/// Counter `name` (as in `handshakes`) of a stopped proxy's console.
fn counter(said: &str, name: &str) -> u64 {
    let at = said.find(&format!(" {name}=")).unwrap_or_else(|| panic!("no {name} in {said}"));
    said[at + name.len() + 2..].split(' ').next().unwrap().trim().parse().unwrap()
}

/// curl in the daemon's namespace to `https://NAME/PATH` at `ip`,
/// trusting `ca`: (exit code, body).
fn curl(d: &Daemon, name: &str, ip: &str, ca: &str, path: &str, extra: &[&str]) -> (i32, Vec<u8>) {
    let o = d
        .in_netns(&["curl", "-sS", "--max-time", "20", "--cacert", ca, "--resolve", &format!("{name}:443:{ip}")])
        .args(extra)
        .arg(format!("https://{name}{path}"))
        .output()
        .unwrap();
    (o.status.code().unwrap_or(-1), o.stdout)
}

#[test]
fn a_vm_per_tenant_terminates_tls_with_its_own_key_and_relays_to_the_backend() {
    let dir = fresh_dir("tls-tenants");
    let d = Daemon::start_in_netns("tls", "10.77.43.0/24", &["--pool", "16M=3"]);
    let (cert1, key1) = tenant(&dir, "one.test", "ed25519");
    let (cert2, key2) = tenant(&dir, "two.test", "ec");
    let (id1, ip1) = start(&d, "one", &cert1, &key1);
    let (id2, ip2) = start(&d, "two", &cert2, &key2);
    let _backend = backend(&d);

    // Both ways through each VM: a download of many records, an upload.
    let big: Vec<u8> = (0..300000u32).map(|i| ((i * 7) % 251) as u8).collect();
    let upload = dir.join("upload");
    let data: Vec<u8> = (0..200000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(&upload, &data).unwrap();
    let digest = {
        let o = std::process::Command::new("sha256sum").arg(&upload).output().unwrap();
        String::from_utf8_lossy(&o.stdout).split(' ').next().unwrap().to_string()
    };
    for (name, ip, ca) in [("one.test", &ip1, &cert1), ("two.test", &ip2, &cert2)] {
        let (code, body) = curl(&d, name, ip, ca, "/big", &[]);
        assert_eq!(code, 0, "curl {name}: {}", String::from_utf8_lossy(&body));
        assert!(body == big, "{name}: /big came back as {} bytes, not the 300000 sent", body.len());
        let (code, body) = curl(&d, name, ip, ca, "/up", &["--data-binary", &format!("@{}", upload.display()), "--http1.0"]);
        assert_eq!(code, 0, "curl {name} upload");
        assert_eq!(String::from_utf8_lossy(&body), format!("{digest} /up"), "{name}: the backend got another body");
    }
    // Both directions at once: 1 MiB through an echo backend while the
    // client still sends (a relay that waited on one side would stall).
    let (id3, ip3) = start_with(&d, "three", &cert1, &key1, "10.77.43.1:8081");
    // (One thread, sending and receiving as each side has room: an SSL
    // object is not for two threads at once.)
    let script = format!(
        r#"
import socket, ssl, select, hashlib, time
ctx = ssl.create_default_context(cafile='{cert1}')
s = ctx.wrap_socket(socket.create_connection(('{ip3}', 443), timeout=30), server_hostname='one.test')
s.setblocking(False)
data = bytes((i * 31 + 7) % 256 for i in range(1 << 20))
sent = 0
got = bytearray()
deadline = time.time() + 60
while len(got) < len(data) and time.time() < deadline:
    r, w, _ = select.select([s], [s] if sent < len(data) else [], [], 1)
    if w:
        try:
            sent += s.send(data[sent:sent + 65536])
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
            pass
    if r or s.pending():
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    deadline = 0
                    break
                got += d
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass
print(len(got), hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest())
"#
    );
    assert_eq!(d.python(&script).trim(), format!("{} True", 1 << 20), "the echo through the VM");
    stop_for_counters(&d, &id3);

    // TLS 1.3 it is, and each VM proves only its own tenant's name: the
    // other tenant's CA does not vouch for it (curl: 60, peer certificate).
    let o = d.in_netns(&["openssl", "s_client", "-connect", &format!("{ip1}:443"), "-servername", "one.test", "-CAfile", &cert1, "-brief"]).stdin(Stdio::null()).output().unwrap();
    assert!(out(&o).contains("Protocol version: TLSv1.3") && out(&o).contains("Verification: OK"), "{}", out(&o));
    let (code, _) = curl(&d, "two.test", &ip1, &cert2, "/", &[]);
    assert_eq!(code, 60, "VM one answered for tenant two");
    let (code, _) = curl(&d, "one.test", &ip2, &cert1, "/", &[]);
    assert_eq!(code, 60, "VM two answered for tenant one");

    // The keys went to the VMs only: nothing wispd keeps holds them — no
    // line of their PEM, nor the base64 of the files as the API carried
    // them.
    let mut needles: Vec<String> = Vec::new();
    for key in [&key1, &key2] {
        let pem = std::fs::read_to_string(key).unwrap();
        needles.extend(pem.lines().filter(|l| !l.starts_with("-----") && l.len() >= 16).map(str::to_string));
        needles.push(wisp_api::GuestFile::new("/key.pem", pem.as_bytes()).data[..48].to_string());
    }
    assert!(needles.len() >= 4, "{needles:?}");
    let mut stack = vec![d.dir.clone()];
    while let Some(p) = stack.pop() {
        if p.starts_with(&dir) {
            continue;
        }
        if let Ok(rd) = std::fs::read_dir(&p) {
            stack.extend(rd.flatten().map(|e| e.path()));
        } else if let Ok(bytes) = std::fs::read(&p) {
            let text = String::from_utf8_lossy(&bytes);
            for n in &needles {
                assert!(!text.contains(n.as_str()), "{} holds a tenant's key", p.display());
            }
        }
    }

    for id in [&id1, &id2] {
        let said = stop_for_counters(&d, id);
        assert!(counter(&said, "handshakes") >= 2, "{said}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn garbage_in_the_handshake_is_refused_and_the_proxy_goes_on() {
    let dir = fresh_dir("tls-garbage");
    let d = Daemon::start_in_netns("tlsbad", "10.77.44.0/24", &[]);
    let (cert, key) = tenant(&dir, "g.test", "ed25519");
    let (id, ip) = start_with(&d, "g", &cert, &key, "10.77.44.1:8080");
    let mut c = d.client();
    let _backend = backend(&d);

    // A client that connects and says nothing holds only its own task, and
    // is closed when its 10 s for the handshake are up (it says when).
    let silent = d
        .in_netns(&["python3", "-c", &format!("import socket,time; s=socket.create_connection(('{ip}',443)); s.settimeout(40); t=time.time(); s.recv(1); print('%.1f' % (time.time()-t))")])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let silent_started = Instant::now();

    // Plain HTTP, random bytes, a record header announcing 64 KiB, a
    // ClientHello cut short by a close: each connection ends at once (an
    // alert or a close, never a hang until the handshake's timeout).
    let script = format!(
        r#"
import os, socket, time
def probe(data, close_write=False):
    s = socket.create_connection(('{ip}', 443), timeout=8)
    t = time.time(); got = b''
    try:
        s.sendall(data)
        if close_write: s.shutdown(socket.SHUT_WR)
        while True:
            d = s.recv(4096)
            if not d: break
            got += d
    except socket.timeout:
        return 'hung'
    except OSError:
        pass  # reset: the server closed while we still sent
    return 'closed %.1f %s' % (time.time() - t, got[:1].hex())
print(probe(b'GET / HTTP/1.1\r\nHost: x\r\n\r\n'))
print(probe(os.urandom(100000)))
print(probe(b'\x16\x03\x01\xff\xff' + b'\x01' * 2000))
print(probe(b'\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03', close_write=True))
"#
    );
    let said = d.python(&script);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 4, "{said}");
    for l in &lines {
        assert!(l.starts_with("closed "), "a connection was not ended: {said}");
    }
    // Not TLS at all, or a record too long: TLS' own answer, an alert (21).
    assert!(lines[0].ends_with(" 15") && lines[2].ends_with(" 15"), "no alert: {said}");

    // The proxy serves on, beside the silent client.
    let (code, body) = curl(&d, "g.test", &ip, &cert, "/after", &[]);
    let body = String::from_utf8_lossy(&body);
    assert_eq!(code, 0, "{body}");
    assert!(body.ends_with(" /after"), "{body}");
    assert!(silent_started.elapsed() < Duration::from_secs(9), "too slow to tell the silent client's timeout apart");
    let said = silent.wait_with_output().unwrap();
    let after: f64 = String::from_utf8_lossy(&said.stdout).trim().parse().unwrap_or(-1.0);
    assert!((9.0..20.0).contains(&after), "the silent client was closed after {after} s, not at its handshake's 10 s");
    // The failures were said and counted.
    let mut errs = Vec::new();
    c.logs_stderr(&id, false, &mut |b| {
        errs.extend_from_slice(b);
        true
    })
    .unwrap();
    let errs = String::from_utf8_lossy(&errs);
    assert!(errs.matches("tlsproxy: handshake with ").count() >= 5, "{errs}");
    assert!(errs.contains("not finished in 10 s"), "{errs}");
    // A crowd the heap cannot hold: 100 clients at once that say nothing
    // (a 16 MiB VM serves some 40 at once); the rest are closed at once
    // and counted, the first ones held to their handshake's timeout.
    let crowd = d.python(&format!(
        r#"
import socket, time
cs = []
for i in range(100):
    c = socket.create_connection(('{ip}', 443), timeout=10)
    c.settimeout(0.05)
    cs.append(c)
deadline = time.time() + 3
closed = set()
while time.time() < deadline:
    for i, c in enumerate(cs):
        if i in closed: continue
        try:
            if c.recv(1) == b'': closed.add(i)
        except socket.timeout:
            pass
        except OSError:
            closed.add(i)
print(len(closed))
"#
    ));
    let closed: usize = crowd.trim().parse().unwrap();
    assert!((20..=80).contains(&closed), "{closed} of 100 silent clients were closed at once");
    let start = Instant::now();
    let said = stop_for_counters(&d, &id);
    assert!(counter(&said, "handshakes") == 1 && counter(&said, "refused") == closed as u64, "{said}");
    assert!(counter(&said, "failed") >= 5, "the four kinds of garbage and the silent client: {said}");
    assert!(start.elapsed() < Duration::from_secs(20));

    // A backend that refuses: the client gets the handshake, then a
    // close_notify and nothing else (curl: 52, an empty reply); counted.
    let (id, ip) = start_with(&d, "g-nobackend", &cert, &key, "10.77.44.1:8099");
    let (code, _) = curl(&d, "g.test", &ip, &cert, "/", &[]);
    assert_eq!(code, 52, "a refused backend: not an empty reply");
    let said = stop_for_counters(&d, &id);
    assert!(counter(&said, "handshakes") == 1 && counter(&said, "backend_failed") == 1, "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_or_bad_certificate_key_or_backend_is_refused_at_start() {
    let dir = fresh_dir("tls-start");
    let d = Daemon::start_in_netns("tlsstart", "10.77.45.0/24", &[]);
    let (cert, key) = tenant(&dir, "s.test", "ed25519");
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, b"-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n\x00\xff").unwrap();
    let junk = junk.to_str().unwrap();
    let f = |host: &str, guest: &str| format!("{host}:{guest}");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![], "usage: tlsproxy BACKEND_IP:PORT"),
        (vec!["--".into(), "nonsense".into()], "usage: tlsproxy BACKEND_IP:PORT"),
        (vec!["--".into(), "10.77.45.1:0".into()], "usage: tlsproxy BACKEND_IP:PORT"),
        (vec!["--".into(), "10.77.45.1:80".into()], "cannot read /cert.pem"),
        (vec!["--file".into(), f(&cert, "/cert.pem"), "--".into(), "10.77.45.1:80".into()], "cannot read /key.pem"),
        (vec!["--file".into(), f(junk, "/cert.pem"), "--file".into(), f(&key, "/key.pem"), "--".into(), "10.77.45.1:80".into()], "/cert.pem: not a PEM certificate chain"),
        (vec!["--file".into(), f(&cert, "/cert.pem"), "--file".into(), f(&cert, "/key.pem"), "--".into(), "10.77.45.1:80".into()], "/key.pem: not a PEM private key"),
        (vec!["--file".into(), f(&key, "/cert.pem"), "--file".into(), f(&key, "/key.pem"), "--".into(), "10.77.45.1:80".into()], "/cert.pem: no certificate in it"),
    ];
    for (args, why) in cases {
        let mut all = vec!["run", "--net", "--timeout", "20s"];
        let (files, rest): (Vec<&String>, Vec<&String>) = {
            let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
            (args[..split].iter().collect(), args[split..].iter().collect())
        };
        all.extend(files.iter().map(|s| s.as_str()));
        all.push("tlsproxy");
        all.extend(rest.iter().map(|s| s.as_str()));
        let o = d.wisp(&all);
        assert_eq!(o.status.code(), Some(2), "{all:?}: {}", out(&o));
        assert!(out(&o).contains(why), "{all:?} did not say {why:?}: {}", out(&o));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
