//! Live migration between two real daemons on this host (`wisp migrate`):
//! a counting VM moves and goes on counting at the destination with its
//! memory whole, and is gone at the source; a destination with another key,
//! or none listening, leaves it running at the source.

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
    assert!(dst.wisp(&["kill", "c"]).status.success());
    let _ = std::fs::remove_dir_all(&keys);
}

/// A destination that proves the key, then fails at `phase`: "header" (it
/// closes once it has read the header), "first" (once it has read the
/// whole snapshot), "answer" (it reads everything and refuses). Listens on
/// a port it prints first.
const FAKE_DESTINATION: &str = r#"
import hashlib, hmac, os, socket, struct, sys
key, phase = open(sys.argv[1], 'rb').read().strip(), sys.argv[2]
l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(1)
print(l.getsockname()[1], flush=True)
c, _ = l.accept(); f = c.makefile('rb')
n = os.urandom(32); c.sendall(b'WISPMIG1 ' + n.hex().encode() + b'\n')
proof, theirs = f.readline().decode().split()
assert hmac.compare_digest(bytes.fromhex(proof), hmac.new(key, b'src' + n, hashlib.sha256).digest())
c.sendall(hmac.new(key, b'dst' + bytes.fromhex(theirs), hashlib.sha256).hexdigest().encode() + b'\n')
f.readline()
if phase == 'header': c.close(); sys.exit(0)
size = struct.unpack('<Q', f.read(8))[0]; f.read(size)
if phase == 'first': c.close(); sys.exit(0)
size = struct.unpack('<Q', f.read(8))[0]; f.read(size)
c.sendall(b'{"ok": false, "error": "no room here"}\n'); c.close()
"#;

#[test]
fn a_migration_that_fails_at_any_phase_leaves_the_vm_running_here() {
    let keys = common::fresh_dir("migrate-phases");
    let key = key_file(&keys, "k", "a shared migration key 0123456789");
    let src = Daemon::start("mig-phases", &["--migrate-key", &key]);
    let mut cs = src.client();
    assert!(src.wisp(&["run", "-d", "--name", "c", "counter", "--", "100000", "20ms"]).status.success());
    wait_console(&mut cs, "c", "count 2 ");
    for (phase, says) in [("header", "the VM runs on here"), ("first", "the VM runs on here"), ("answer", "no room here")] {
        let mut fake = std::process::Command::new("python3")
            .args(["-c", FAKE_DESTINATION, &key, phase])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut port = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(fake.stdout.take().unwrap()), &mut port).unwrap();
        let o = src.wisp(&["migrate", "c", "--to", &format!("127.0.0.1:{}", port.trim())]);
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
