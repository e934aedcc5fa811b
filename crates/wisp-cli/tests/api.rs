//! The API's bounds against a real wispd: who may connect (socket mode and
//! group, peer credentials), `Expect: 100-continue` (with curl), idle and
//! slow connections, the connection cap; and port forwards: the address
//! they listen on, their connection cap and idle timeout (in a network
//! namespace of the test's own).

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{eventually, wait_console};
use common::daemon::Daemon;
use wisp_api::client::{ApiError, Client};
use wisp_api::{CreateVm, PortMap};

/// A group id no account on a test machine is expected to have.
const GROUP: u32 = 64242;
/// `nobody`.
const NOBODY: &str = "65534";

/// `curl` on the daemon's socket, as root or (with `setpriv`) as another
/// user; `extra` goes before the URL.
fn curl(d: &Daemon, as_user: Option<&[&str]>, extra: &[&str], path: &str) -> Output {
    let sock = d.socket.to_str().unwrap();
    let url = format!("http://wisp{path}");
    let mut argv: Vec<&str> = Vec::new();
    if let Some(setpriv) = as_user {
        argv.push("setpriv");
        argv.extend_from_slice(setpriv);
    }
    argv.extend_from_slice(&["curl", "-sS", "-i", "--max-time", "10", "--unix-socket", sock]);
    argv.extend_from_slice(extra);
    argv.push(&url);
    Command::new(argv[0]).args(&argv[1..]).output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// The status line of a `curl -i` answer (the last one: after a 100).
fn status_line(o: &Output) -> String {
    let out = text(o).0;
    out.lines().filter(|l| l.starts_with("HTTP/1.1 ")).last().unwrap_or("").trim().to_string()
}

#[test]
fn the_socket_is_its_groups_and_other_peers_get_403() {
    let gid = GROUP.to_string();
    let d = Daemon::start("group", &["--pool", "16M=0", "--socket-group", &gid]);
    let meta = std::fs::metadata(&d.socket).unwrap();
    assert_eq!((meta.mode() & 0o777, meta.gid()), (0o660, GROUP), "socket mode {:o}", meta.mode());
    assert!(d.log().contains(&format!("mode 0660, group '{gid}' (gid {gid})")), "{}", d.log());

    let groups = format!("--groups={gid}");
    let member: [&[&str]; 2] = [
        &["--reuid", NOBODY, "--regid", NOBODY, &groups], // a supplementary group
        &["--reuid", NOBODY, "--regid", &gid, "--clear-groups"], // the primary group
    ];
    for who in member {
        let o = curl(&d, Some(who), &[], "/v1/version");
        assert_eq!(status_line(&o), "HTTP/1.1 200 OK", "{who:?}: {:?}", text(&o));
    }
    let stranger: &[&str] = &["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"];
    // The file's mode keeps others out...
    let o = curl(&d, Some(stranger), &[], "/v1/version");
    assert_eq!(o.status.code(), Some(7), "{:?}", text(&o));
    assert!(text(&o).1.contains("Permission denied") || text(&o).1.contains("Couldn't connect"), "{:?}", text(&o));
    // ...and so does the daemon, when the mode was widened by mistake.
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = curl(&d, Some(stranger), &[], "/v1/version");
    let (out, _) = text(&o);
    assert_eq!(status_line(&o), "HTTP/1.1 403 Forbidden", "{:?}", text(&o));
    let want = format!("permission denied: uid {NOBODY} is neither root nor a member of group '{gid}' (gid {gid})");
    assert!(out.contains(&want) && out.contains("Connection: close"), "{out}");
    assert!(d.log().contains(&format!("refused a connection from uid {NOBODY}")), "{}", d.log());
    // Root is always let in, and the daemon still serves.
    assert_eq!(status_line(&curl(&d, None, &[], "/v1/version")), "HTTP/1.1 200 OK");
    assert_eq!(d.client().version().unwrap().abi, wisp_abi::ABI_VERSION);
}

#[test]
fn without_its_group_the_socket_stays_root_only() {
    let d = Daemon::start("nogroup", &["--pool", "16M=0", "--socket-group", "no-such-group-wisp-test"]);
    let meta = std::fs::metadata(&d.socket).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600, "socket mode {:o}", meta.mode());
    assert!(
        d.log().contains("group 'no-such-group-wisp-test' does not exist: root-only (0600)"),
        "{}",
        d.log()
    );
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = curl(&d, Some(&["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"]), &[], "/v1/version");
    assert_eq!(status_line(&o), "HTTP/1.1 403 Forbidden", "{:?}", text(&o));
    assert!(text(&o).0.contains("the API is root-only"), "{:?}", text(&o));
    assert_eq!(status_line(&curl(&d, None, &[], "/v1/version")), "HTTP/1.1 200 OK");
}

#[test]
fn expect_100_continue_is_answered_and_other_expectations_refused() {
    let d = Daemon::start("expect", &[]);
    let body = r#"{"image":"noop"}"#;
    // curl waits (here up to 30 s, past its 10 s limit) for the 100 before it sends the body.
    let json = ["-H", "Content-Type: application/json", "--expect100-timeout", "30", "-d", body];
    let mut args = vec!["-H", "Expect: 100-continue"];
    args.extend_from_slice(&json);
    let t = Instant::now();
    let o = curl(&d, None, &args, "/v1/vms");
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(out.starts_with("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created"), "{out}");
    assert!(t.elapsed() < Duration::from_secs(10));
    let vm: wisp_api::VmInfo = serde_json::from_str(out.rsplit("\r\n\r\n").next().unwrap()).unwrap();
    assert_eq!(d.client().wait(&vm.id).unwrap().code, 0);

    let mut args = vec!["-H", "Expect: something-else"];
    args.extend_from_slice(&json);
    let o = curl(&d, None, &args, "/v1/vms");
    assert_eq!(status_line(&o), "HTTP/1.1 417 Expectation Failed", "{:?}", text(&o));
    assert!(text(&o).0.contains("unsupported expectation 'something-else' (only 100-continue is)"), "{:?}", text(&o));
    assert_eq!(d.client().list().unwrap().len(), 1, "a refused request created a VM");
}

/// Read until EOF (or an error); what came, and how long it took.
fn read_to_close(s: &mut UnixStream) -> (String, Duration) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (t, mut got) = (Instant::now(), Vec::new());
    let r = s.read_to_end(&mut got);
    assert!(r.is_ok(), "connection not closed within 10 s: {r:?} after {:?}", String::from_utf8_lossy(&got));
    (String::from_utf8_lossy(&got).into_owned(), t.elapsed())
}

#[test]
fn idle_and_slow_api_connections_are_closed() {
    let d = Daemon::start("timeouts", &["--pool", "16M=0", "--api-idle-timeout", "1s", "--api-read-timeout", "2s"]);
    // Idle: closed without a word after the idle timeout.
    let mut idle = UnixStream::connect(&d.socket).unwrap();
    let (said, after) = read_to_close(&mut idle);
    assert_eq!(said, "");
    assert!(after >= Duration::from_millis(900), "closed after {after:?}");
    // Idle after a request on a kept-alive connection: the same.
    let mut kept = UnixStream::connect(&d.socket).unwrap();
    kept.write_all(b"GET /v1/version HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (said, _) = read_to_close(&mut kept);
    assert!(said.starts_with("HTTP/1.1 200 OK") && said.contains("Connection: keep-alive"), "{said}");
    // Slow: a request begun but never finished is answered 408.
    let mut slow = UnixStream::connect(&d.socket).unwrap();
    slow.write_all(b"POST /v1/vms HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"ima").unwrap();
    let (said, after) = read_to_close(&mut slow);
    assert!(said.starts_with("HTTP/1.1 408 Request Timeout"), "{said}");
    assert!(said.contains("the request did not arrive within 2s"), "{said}");
    assert!(after >= Duration::from_millis(1900), "answered after {after:?}");
    // A trickle does not extend it: one byte every 100 ms still ends at 2 s.
    let mut trickle = UnixStream::connect(&d.socket).unwrap();
    let t = Instant::now();
    for b in b"GET /v1/version HTTP/1.1\r\nX: ".iter().chain(std::iter::repeat(&b'a')) {
        if trickle.write_all(&[*b]).is_err() || t.elapsed() > Duration::from_secs(10) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100)); // the client's pace, not synchronisation
    }
    assert!(t.elapsed() < Duration::from_secs(5), "a trickling request was read for {:?}", t.elapsed());
    assert_eq!(d.client().version().unwrap().abi, wisp_abi::ABI_VERSION);
}

#[test]
fn connections_over_the_cap_are_answered_503() {
    let d = Daemon::start("cap", &["--pool", "16M=0", "--max-api-connections", "2"]);
    // Two kept-alive connections, each served (earlier ones may still be
    // closing: retry until both are in).
    let ten = Duration::from_secs(10);
    let hold = || eventually(ten, || "no API slot came free".into(), || {
        let mut c = Client::connect(&d.socket).ok()?;
        c.version().ok().map(|_| c)
    });
    let (first, _second) = (hold(), hold());
    let third = Client::connect(&d.socket).unwrap().version();
    assert!(
        matches!(third, Err(ApiError::Status(503, ref m)) if m == "too many API connections (at most 2); try again later"),
        "{third:?}"
    );
    // curl sees the same.
    let o = curl(&d, None, &[], "/v1/version");
    assert_eq!(status_line(&o), "HTTP/1.1 503 Service Unavailable", "{:?}", text(&o));
    // A connection closed gives its slot back.
    drop(first);
    let mut c = hold();
    assert!(c.version().is_ok());
}

#[test]
fn port_forwards_listen_on_loopback_unless_told_otherwise() {
    let d = Daemon::start_in_netns("bind", "10.78.1.0/24", &[]);
    let mut c = d.client();
    let req = CreateVm { image: "daytime".into(), ports: vec!["8013:13".parse().unwrap()], ..Default::default() };
    let vm = c.create(&req).unwrap();
    assert_eq!(vm.ports, vec![PortMap { host: 8013, vm: 13, addr: None }]);
    wait_console(&mut c, &vm.id, "daytime: listening");
    let probe = |addr: &str, port: u16| {
        d.python(&format!(
            "import socket\n\
             try:\n  s = socket.create_connection(('{addr}', {port}), timeout=5); print('open', s.recv(100).decode().strip())\n\
             except ConnectionRefusedError: print('refused')"
        ))
    };
    assert!(probe("127.0.0.1", 8013).starts_with("open "), "loopback not forwarded");
    // The bridge's address is the host's too, but the forward is not there.
    assert_eq!(probe("10.78.1.1", 8013).trim(), "refused");

    // Asked for an address (the CLI's -p ADDR:HOSTPORT:VMPORT): there only.
    let o = d.wisp(&["run", "-d", "-p", "10.78.1.1:8014:13", "daytime"]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    let id = text(&o).0.trim().to_string();
    let info = c.get(&id).unwrap();
    assert_eq!(info.ports, vec![PortMap { host: 8014, vm: 13, addr: Some([10, 78, 1, 1].into()) }]);
    wait_console(&mut c, &id, "daytime: listening");
    assert!(probe("10.78.1.1", 8014).starts_with("open "));
    assert_eq!(probe("127.0.0.1", 8014).trim(), "refused");

    // An address that is not the host's: a 400 with why, and nothing started.
    let n = c.list().unwrap().len();
    let bad = r#"{"image":"daytime","ports":[{"host":8015,"vm":13,"addr":"192.0.2.1"}]}"#;
    let r = c.raw("POST", "/v1/vms", Some(bad.as_bytes())).unwrap();
    assert_eq!(r.status, 400, "{}", r.error_message());
    assert!(r.error_message().contains("cannot forward host port 8015"), "{}", r.error_message());
    assert_eq!(c.list().unwrap().len(), n);
    let r = c.raw("POST", "/v1/vms", Some(br#"{"image":"daytime","ports":[{"host":1,"vm":2,"addr":"x"}]}"#)).unwrap();
    assert_eq!(r.status, 400, "{}", r.error_message());
}

/// An echo VM whose port 7 is forwarded from host port 8007.
fn echo_vm(d: &Daemon) {
    let mut c = d.client();
    let ports = vec![PortMap { host: 8007, vm: 7, addr: None }];
    let vm = c.create(&CreateVm { image: "echo".into(), ports, ..Default::default() }).unwrap();
    wait_console(&mut c, &vm.id, "echo: listening");
}

const ECHO: &str = r#"
import socket, time
def conn():
    return socket.create_connection(("127.0.0.1", 8007), timeout=10)
def echo(s, m):
    try:
        s.sendall(m)
        return s.recv(100)
    except (ConnectionResetError, BrokenPipeError):
        return b""
def echo_new(m):
    # A refused connection may be reset before connect() even returns.
    try:
        return echo(conn(), m)
    except ConnectionResetError:
        return b""
"#;

#[test]
fn forwarded_connections_over_the_cap_are_refused() {
    let d = Daemon::start_in_netns("fwdcap", "10.78.2.0/24", &["--max-port-connections", "2"]);
    echo_vm(&d);
    let out = d.python(&format!(
        "{ECHO}
a, b = conn(), conn()
assert echo(a, b'a') == b'a' and echo(b, b'b') == b'b'
assert echo_new(b'c') == b'', 'a third connection was served'
a.close()
deadline = time.time() + 10
while echo_new(b'd') != b'd':
    assert time.time() < deadline, 'the slot did not come back'
print('ok')"
    ));
    assert_eq!(out.trim(), "ok");
}

#[test]
fn idle_forwarded_connections_are_closed() {
    let d = Daemon::start_in_netns("fwdidle", "10.78.3.0/24", &["--forward-idle-timeout", "1s"]);
    echo_vm(&d);
    let out = d.python(&format!(
        "{ECHO}
a = conn()
assert echo(a, b'a') == b'a'
t = time.time()
try:
    left = a.recv(100)
except ConnectionResetError:
    left = b''
took = time.time() - t
assert left == b'' and 0.9 <= took < 9, (left, took)
b = conn()
for i in range(12):
    assert echo(b, b'x') == b'x', 'a busy connection was closed'
    time.sleep(0.1)
print('ok')"
    ));
    assert_eq!(out.trim(), "ok");
}
