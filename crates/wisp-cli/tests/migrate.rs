//! Live migration between two real daemons on this host (`wisp migrate`):
//! a counting VM moves and goes on counting at the destination with its
//! memory whole, and is gone at the source; a destination with another key,
//! or none listening, leaves it running at the source; an echo server moves
//! between two daemons in two network namespaces joined by a veth pair
//! while a client streams through a TCP connection to it, and the
//! connection carries on.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::daemon::Daemon;
use common::{console, eventually, wait_console};

fn out(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn sum_after(ticks: u64) -> u64 {
    (0..ticks * 512).fold(0u64, |a, i| a.wrapping_add(i.wrapping_mul(i)))
}

fn counts(text: &str) -> Vec<u64> {
    text.lines().filter_map(|l| l.strip_prefix("count ")).filter_map(|l| l.split(' ').next()).filter_map(|n| n.parse().ok()).collect()
}

/// A key file (mode 0600) holding `key`.
fn key_file(dir: &std::path::Path, name: &str, key: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, key).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.display().to_string()
}

/// A TCP port free on the loopback now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn a_vm_moves_to_another_daemon_and_goes_on_there() {
    let keys = common::fresh_dir("migrate-keys");
    let key = key_file(&keys, "k", "a shared migration key 0123456789");
    let other = key_file(&keys, "o", "another daemon's key 9876543210xx");
    let port = free_port();
    let to = format!("127.0.0.1:{port}");
    let dst = Daemon::start("mig-dst", &["--migrate-key", &key, "--migrate-listen", &to]);
    let src = Daemon::start("mig-src", &["--migrate-key", &key]);
    let wrong_port = free_port();
    let wrong_to = format!("127.0.0.1:{wrong_port}");
    let wrong = Daemon::start("mig-wrong", &["--migrate-key", &other, "--migrate-listen", &wrong_to]);
    let (mut cs, mut cd) = (src.client(), dst.client());
    assert!(src.wisp(&["run", "-d", "--name", "c", "counter", "--", "100000", "20ms"]).status.success());
    wait_console(&mut cs, "c", "count 3 ");

    // A destination with another key, and none at all: refused, the VM runs
    // on here.
    let o = src.wisp(&["migrate", "c", "--to", &wrong_to]);
    assert!(!o.status.success() && out(&o).contains("the migration key does not match"), "{}", out(&o));
    let o = src.wisp(&["migrate", "c", "--to", &format!("127.0.0.1:{}", free_port())]);
    assert!(!o.status.success() && out(&o).contains("the VM runs on here"), "{}", out(&o));
    let before = *counts(&console(&mut cs, "c")).last().unwrap();
    wait_console(&mut cs, "c", &format!("count {} ", before + 2));
    assert!(cd.list().unwrap().is_empty() && wrong.client().list().unwrap().is_empty());

    // The move.
    let o = src.wisp(&["migrate", "c", "--to", &to]);
    assert!(o.status.success(), "{}", out(&o));
    assert!(cs.get("c").is_err(), "still at the source");
    let there = cd.get("c").expect("at the destination, with its name");
    assert_eq!(there.state, wisp_api::VmState::Running);
    // It goes on from where it was, its memory whole.
    let text = eventually(Duration::from_secs(10), || "no count there".into(), || Some(console(&mut cd, "c")).filter(|t| t.contains("count ")));
    let k = counts(&text)[0];
    assert!(k >= before + 2, "restored at {k}, had counted to {}", before + 2);
    wait_console(&mut cd, "c", &format!("count {} sum {}", k + 2, sum_after(k + 2)));

    // On again, to a daemon of this host taking migrations on a Unix socket.
    let sock = keys.join("migrate.sock");
    let third = Daemon::start("mig-unix", &["--migrate-key", &key, "--migrate-listen", sock.to_str().unwrap()]);
    let before = counts(&console(&mut cd, "c")).last().copied().unwrap_or(k);
    let o = dst.wisp(&["migrate", "c", "--to", sock.to_str().unwrap()]);
    assert!(o.status.success(), "{}", out(&o));
    let mut ct = third.client();
    assert!(cd.get("c").is_err(), "still at the second daemon");
    // Its console there begins with what it printed there: the ticks
    // printed while the move was on stayed behind.
    let text = eventually(Duration::from_secs(10), || "no count there".into(), || Some(console(&mut ct, "c")).filter(|t| t.contains("count ")));
    let k = counts(&text)[0];
    assert!(k > before, "restored at {k}, had counted to {before}");
    wait_console(&mut ct, "c", &format!("count {} sum {}", k + 2, sum_after(k + 2)));
    let o = third.wisp(&["migrate", "c", "--to", "relative.sock"]);
    assert!(!o.status.success() && out(&o).contains("expected ADDRESS:PORT or the absolute path of a Unix socket"), "{}", out(&o));
    assert!(third.wisp(&["kill", "c"]).status.success());
    let _ = std::fs::remove_dir_all(&keys);
}

/// A destination that proves the key, then fails at `phase`: "header" (it
/// closes once it has read the header), "stall" (it says `header` and waits
/// for a line on its input before it closes), "first" (once it has read the
/// whole snapshot), "refuse" (it refuses the whole snapshot), "answer" (it
/// takes the whole, reads the increment and refuses), "silent" (it takes
/// both and closes without an answer), "forged" (it answers the whole with
/// a message whose tag does not verify: as one changed on the way would). Listens on
/// a port it prints first.
const FAKE_DESTINATION: &str = r#"
import hashlib, hmac, os, socket, struct, sys
key, phase = open(sys.argv[1], 'rb').read().strip(), sys.argv[2]
l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(1)
print(l.getsockname()[1], flush=True)
c, _ = l.accept(); f = c.makefile('rb')
n = os.urandom(32); c.sendall(b'WISPMIG3 ' + n.hex().encode() + b'\n')
proof, theirs = f.readline().decode().split()
assert hmac.compare_digest(bytes.fromhex(proof), hmac.new(key, b'src' + n, hashlib.sha256).digest())
c.sendall(hmac.new(key, b'dst' + bytes.fromhex(theirs), hashlib.sha256).hexdigest().encode() + b'\n')
# Every message after the handshake carries its tag (channel.rs).
session = hmac.new(key, b'session' + n + bytes.fromhex(theirs), hashlib.sha256).digest()
sent = [0]
def say(text):
    sent[0] += 1
    tag = hmac.new(session, b'd>s' + struct.pack('<Q', sent[0]) + text, hashlib.sha256).hexdigest()
    c.sendall(text + b'\n' + tag.encode() + b'\n')
def part():
    size = struct.unpack('<Q', f.read(8))[0]; f.read(size); f.read(32)
f.readline(); f.readline()
if phase == 'header': c.close(); sys.exit(0)
if phase == 'stall': print('header', flush=True); sys.stdin.readline(); c.close(); sys.exit(0)
part()
if phase == 'first': c.close(); sys.exit(0)
if phase == 'refuse': say(b'{"ok": false, "error": "no room for its pages"}'); c.close(); sys.exit(0)
if phase == 'forged': c.sendall(b'{"ok": true}\n' + b'00' * 32 + b'\n'); c.close(); sys.exit(0)
say(b'{"ok": true}')
part()
if phase == 'silent': c.close(); sys.exit(0)
say(b'{"ok": false, "error": "no room here"}'); c.close()
"#;

#[test]
fn a_migration_that_fails_at_any_phase_leaves_the_vm_running_here() {
    let keys = common::fresh_dir("migrate-phases");
    let key = key_file(&keys, "k", "a shared migration key 0123456789");
    let src = Daemon::start("mig-phases", &["--migrate-key", &key]);
    let mut cs = src.client();
    assert!(src.wisp(&["run", "-d", "--name", "c", "counter", "--", "100000", "20ms"]).status.success());
    wait_console(&mut cs, "c", "count 2 ");
    for (phase, says) in [("header", "the VM runs on here"), ("first", "the VM runs on here"), ("refuse", "no room for its pages"), ("forged", "does not verify"), ("answer", "no room here")] {
        let (mut fake, port) = fake_destination(&key, phase);
        let o = src.wisp(&["migrate", "c", "--to", &format!("127.0.0.1:{port}")]);
        assert!(!o.status.success() && out(&o).contains(says), "{phase}: {}", out(&o));
        let _ = fake.wait();
        // Still here, running (not left paused), counting on.
        let vm = cs.get("c").unwrap();
        assert_eq!(vm.state, wisp_api::VmState::Running, "{phase}");
        let last = *counts(&console(&mut cs, "c")).last().unwrap();
        wait_console(&mut cs, "c", &format!("count {} ", last + 2));
    }
    assert!(src.wisp(&["kill", "c"]).status.success());
    let _ = std::fs::remove_dir_all(&keys);
}

/// A client that streams numbered lines through a TCP connection to the
/// echo service at argv[1] and checks each comes back, one at a time
/// (a socket timeout of 10 s: a connection that stalls or resets fails
/// it). It says `streaming` once under way; once a line arrives on its
/// standard input (the move is done), it checks 50 more round trips and
/// says `ok ROUND_TRIPS LONGEST_GAP_MS`.
const STREAM_CLIENT: &str = r#"
import select, socket, sys, time
s = socket.create_connection((sys.argv[1], 7), timeout=10)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
n, buf, after, worst, last = 0, b'', None, 0.0, time.monotonic()
while after is None or n < after + 50:
    line = b'%d\n' % n
    s.sendall(line)
    while len(buf) < len(line):
        chunk = s.recv(4096)
        if not chunk:
            sys.exit('the connection closed after %d round trips' % n)
        buf += chunk
    if not buf.startswith(line):
        sys.exit('sent %r, got %r' % (line, buf))
    buf = buf[len(line):]
    now = time.monotonic(); worst = max(worst, now - last); last = now
    n += 1
    if n == 20:
        print('streaming', flush=True)
    if after is None and select.select([sys.stdin], [], [], 0.002)[0]:
        sys.stdin.readline(); after = n
print('ok %d %.1f' % (n, worst * 1000), flush=True)
"#;

#[test]
fn a_tcp_stream_goes_on_through_a_move_between_namespaces() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let keys = common::fresh_dir("migrate-net-keys");
    let key = key_file(&keys, "k", "a shared migration key 0123456789");
    // Two hosts: the same VM subnet on each one's bridge, the bridges joined
    // by a veth pair (one Ethernet segment), and a second veth pair for the
    // daemons' own traffic.
    let subnet = "10.77.31.0/24";
    let a = Daemon::start_in_netns("mig-net-a", subnet, &["--migrate-key", &key]);
    let b = Daemon::start_in_netns("mig-net-b", subnet, &["--migrate-key", &key, "--migrate-listen", "0.0.0.0:7799"]);
    let ns_b = b.netns.clone().unwrap();
    let ok = |d: &Daemon, argv: &[&str]| assert!(d.in_netns(argv).status().unwrap().success(), "{argv:?}");
    for d in [&a, &b] {
        ok(d, &["ip", "link", "add", "name", "wisp0", "type", "bridge"]);
        ok(d, &["ip", "link", "set", "wisp0", "up"]);
    }
    ok(&a, &["ip", "link", "add", "name", "seg-a", "type", "veth", "peer", "name", "seg-b", "netns", &ns_b]);
    ok(&a, &["ip", "link", "set", "seg-a", "master", "wisp0", "up"]);
    ok(&b, &["ip", "link", "set", "seg-b", "master", "wisp0", "up"]);
    ok(&a, &["ip", "link", "add", "name", "mig-a", "type", "veth", "peer", "name", "mig-b", "netns", &ns_b]);
    ok(&a, &["ip", "addr", "add", "10.78.31.1/30", "dev", "mig-a"]);
    ok(&a, &["ip", "link", "set", "mig-a", "up"]);
    ok(&b, &["ip", "addr", "add", "10.78.31.2/30", "dev", "mig-b"]);
    ok(&b, &["ip", "link", "set", "mig-b", "up"]);
    // The client: a third namespace on the segment, through a's bridge.
    let client = common::netns::NetNs::new("mig-net-c");
    ok(&a, &["ip", "link", "add", "name", "cli-a", "type", "veth", "peer", "name", "cli-c", "netns", &client.name]);
    ok(&a, &["ip", "link", "set", "cli-a", "master", "wisp0", "up"]);
    client.exec_ok(&["ip", "addr", "add", "10.77.31.250/24", "dev", "cli-c"]);
    client.exec_ok(&["ip", "link", "set", "cli-c", "up"]);
    // A bridge forwards through a new port once the kernel has seen its
    // carrier (up to a second later): the segment is whole then.
    for (d, port) in [(&a, "seg-a"), (&b, "seg-b"), (&a, "cli-a")] {
        eventually(Duration::from_secs(10), || format!("{port} never forwarding"), || {
            let o = d.in_netns(&["bridge", "link", "show", "dev", port]).output().unwrap();
            String::from_utf8_lossy(&o.stdout).contains("state forwarding").then_some(())
        });
    }

    let (mut ca, mut cb) = (a.client(), b.client());
    let o = a.wisp(&["run", "-d", "--name", "e", "--net", "echo"]);
    assert!(o.status.success(), "{}", out(&o));
    wait_console(&mut ca, "e", "echo: listening");
    let ip = ca.get("e").unwrap().ip.expect("an address");

    let mut stream = client.cmd(&["python3", "-c", STREAM_CLIENT, &ip]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let (tx, said) = std::sync::mpsc::channel();
    let lines = BufReader::new(stream.stdout.take().unwrap());
    std::thread::spawn(move || lines.lines().map_while(Result::ok).for_each(|l| drop(tx.send(l))));
    let next = |what: &str| said.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|e| panic!("the client never said {what}: {e}"));
    assert_eq!(next("streaming"), "streaming");

    // The move, mid-stream.
    let o = a.wisp(&["migrate", "e", "--to", "10.78.31.2:7799"]);
    assert!(o.status.success(), "{}", out(&o));
    writeln!(stream.stdin.as_mut().unwrap(), "moved").unwrap();
    let summary = next("ok");
    let st = stream.wait().unwrap();
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut stream.stderr.take().unwrap(), &mut err);
    assert!(st.success() && summary.starts_with("ok "), "{summary} {err}");
    eprintln!("migrated mid-stream: {} ({summary}: round trips, longest gap in ms)", out(&o).trim());

    // It runs at b with its address; a has no copy.
    let there = cb.get("e").expect("at the destination");
    assert_eq!((there.ip.as_deref(), there.state), (Some(ip.as_str()), wisp_api::VmState::Running));
    assert!(ca.get("e").is_err(), "still at the source");
    drop(client);
    let _ = std::fs::remove_dir_all(&keys);
}

/// The fake destination for `phase`, and the port it listens on.
fn fake_destination(key: &str, phase: &str) -> (std::process::Child, u16) {
    let mut fake = std::process::Command::new("python3")
        .args(["-c", FAKE_DESTINATION, key, phase])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(fake.stdout.take().unwrap());
    let mut port = String::new();
    std::io::BufRead::read_line(&mut out, &mut port).unwrap();
    fake.stdout = Some(out.into_inner());
    (fake, port.trim().parse().unwrap())
}

#[test]
fn a_vm_being_moved_is_not_paused_or_saved_meanwhile_and_an_unanswered_move_leaves_it_paused() {
    use std::io::{BufRead, Write};
    let keys = common::fresh_dir("migrate-busy");
    let key = key_file(&keys, "k", "a shared migration key 0123456789");
    let src = Daemon::start("mig-busy", &["--migrate-key", &key]);
    let mut cs = src.client();
    assert!(src.wisp(&["run", "-d", "--name", "c", "counter", "--", "100000", "20ms"]).status.success());
    wait_console(&mut cs, "c", "count 2 ");
    // While a move is under way (the destination holds it after the header):
    let (mut fake, port) = fake_destination(&key, "stall");
    let to = format!("127.0.0.1:{port}");
    let moving = std::thread::scope(|s| {
        let m = s.spawn(|| src.wisp(&["migrate", "c", "--to", &to]));
        let mut said = String::new();
        std::io::BufReader::new(fake.stdout.as_mut().unwrap()).read_line(&mut said).unwrap();
        assert_eq!(said.trim(), "header");
        for (what, o) in [("pause", src.wisp(&["pause", "c"])), ("snapshot", src.wisp(&["snapshot", "c", keys.join("c.snap").to_str().unwrap()])), ("migrate", src.wisp(&["migrate", "c", "--to", &to]))] {
            assert!(!o.status.success() && out(&o).contains("is being migrated"), "{what}: {}", out(&o));
        }
        writeln!(fake.stdin.as_mut().unwrap(), "go").unwrap();
        m.join().unwrap()
    });
    let _ = fake.wait();
    assert!(!moving.status.success() && out(&moving).contains("the VM runs on here"), "{}", out(&moving));
    assert_eq!(cs.get("c").unwrap().state, wisp_api::VmState::Running);
    // Pausing works again once it is over.
    assert!(src.wisp(&["pause", "c"]).status.success() && src.wisp(&["resume", "c"]).status.success());

    // The increment went and no answer came: where the VM runs is not known
    // here, so it stays paused here, and the error says so.
    let (mut fake, port) = fake_destination(&key, "silent");
    let o = src.wisp(&["migrate", "c", "--to", &format!("127.0.0.1:{port}")]);
    let _ = fake.wait();
    assert!(!o.status.success() && out(&o).contains("the VM is left paused here"), "{}", out(&o));
    assert_eq!(cs.get("c").unwrap().state, wisp_api::VmState::Paused);
    assert!(src.wisp(&["resume", "c"]).status.success());
    let last = *counts(&console(&mut cs, "c")).last().unwrap();
    wait_console(&mut cs, "c", &format!("count {} ", last + 2));
    assert!(src.wisp(&["kill", "c"]).status.success());
    let _ = std::fs::remove_dir_all(&keys);
}
