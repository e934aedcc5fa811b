//! Just-in-time VMs (`wisp jit`, `/v1/jit`; `docs/usecases.md`): a
//! client's first connection boots its own VM, whose answer it gets (the
//! bytes it sent before the VM existed are not lost); its later
//! connections go to the same VM, another client's to another; an idle VM
//! is removed; a removed service closes its port and removes its VMs; bad
//! requests are refused with clear errors. Each daemon runs in a network
//! namespace of its own, the clients too.

mod common;

use std::time::Duration;

use common::daemon::Daemon;
use common::eventually;

/// A client in the daemon's namespace: connects to 127.0.0.1:PORT from
/// address SRC, sends MSG (if any) at once and half-closes, prints what
/// comes back until the server closes; `REFUSED` if nothing listens.
const CLIENT: &str = r#"
import errno, socket, sys
port, src, msg = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()
s = socket.socket(); s.settimeout(20); s.bind((src, 0))
try:
    s.connect(("127.0.0.1", port))
except ConnectionRefusedError:
    print("REFUSED"); sys.exit(0)
buf = b""
try:
    if msg:
        # (A server that closed the connection at once, as a service over
        # its cap does, fails these: what came back is the answer.)
        s.sendall(msg); s.shutdown(socket.SHUT_WR)
    while True:
        d = s.recv(4096)
        if not d: break
        buf += d
except (ConnectionResetError, BrokenPipeError):
    pass
except OSError as e:
    if e.errno != errno.ENOTCONN:
        raise
sys.stdout.write(buf.decode(errors="replace"))
"#;

fn client(d: &Daemon, port: u16, src: &str, msg: &str) -> String {
    let o = d.in_netns(&["python3", "-c", CLIENT, &port.to_string(), src, msg]).output().unwrap();
    assert!(o.status.success(), "client: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn out(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A service's clients and its VMs, through the CLI's daemon client.
fn service(d: &Daemon, id: &str) -> wisp_api::JitInfo {
    d.client().jits().unwrap().into_iter().find(|j| j.id == id).expect("the service is listed")
}

/// Every client gets its own VM, booted by its first connection, and
/// keeps it for its later ones until it has been idle; then it goes.
fn each_client_gets_its_vm(args: &[&str], tag: &str, subnet: &str) {
    let d = Daemon::start_in_netns(tag, subnet, args);
    let o = d.wisp(&["jit", "add", "-p", "8007:7", "--idle", "1500ms", "echo"]);
    assert!(o.status.success(), "{}", out(&o));
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(d.client().list().unwrap().is_empty(), "no VM before a client comes");
    // Sent before any VM existed: echoed by the VM booted for it.
    assert_eq!(client(&d, 8007, "127.0.0.2", "first words"), "first words");
    assert_eq!(client(&d, 8007, "127.0.0.2", "again"), "again");
    let s = service(&d, &id);
    assert_eq!((s.boots, s.connections, s.clients.len()), (1, 2, 1), "{s:?}");
    assert_eq!((s.clients[0].client.as_str(), s.clients[0].connections), ("127.0.0.2", 2), "{s:?}");
    assert!(s.clients[0].boot_us > 0, "{s:?}");
    // Another client: another VM.
    assert_eq!(client(&d, 8007, "127.0.0.3", "other"), "other");
    let s = service(&d, &id);
    assert_eq!((s.boots, s.clients.len()), (2, 2), "{s:?}");
    assert_ne!(s.clients[0].vm, s.clients[1].vm, "{s:?}");
    let vms = d.client().list().unwrap();
    assert_eq!(vms.len(), 2, "{vms:?}");
    assert!(vms.iter().all(|v| v.image == "echo" && v.ip.is_some()), "{vms:?}");
    assert!(vms.iter().all(|v| s.clients.iter().any(|c| c.vm == v.id && Some(&c.ip) == v.ip.as_ref())), "{vms:?} {s:?}");
    let ls = out(&d.wisp(&["jit", "ls"]));
    assert!(ls.contains(&id) && ls.contains("127.0.0.2") && ls.contains("127.0.0.3"), "{ls}");
    // Idle for 1.5 s: both VMs go (the reaper looks every ~0.4 s).
    eventually(Duration::from_secs(15), || format!("idle VMs not removed: {:?}", d.client().list()), || {
        d.client().list().unwrap().is_empty().then_some(())
    });
    assert!(service(&d, &id).clients.is_empty());
    // A client that comes back gets a new VM.
    assert_eq!(client(&d, 8007, "127.0.0.2", "back"), "back");
    assert_eq!(service(&d, &id).boots, 3);
    // Removing the service closes its port and removes its VMs.
    let o = d.wisp(&["jit", "rm", &id]);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(client(&d, 8007, "127.0.0.2", "x"), "REFUSED\n");
    assert!(d.client().list().unwrap().is_empty(), "{:?}", d.client().list());
    assert!(d.client().jits().unwrap().is_empty());
}

#[test]
fn each_client_gets_its_own_vm_process() {
    each_client_gets_its_vm(&[], "jit-proc", "10.77.40.0/24");
}

#[test]
fn each_client_gets_its_own_vm_in_a_group() {
    each_client_gets_its_vm(&["--vms-per-process", "8"], "jit-group", "10.77.41.0/24");
}

#[test]
fn bad_services_and_dead_vms_get_clear_errors() {
    let d = Daemon::start_in_netns("jit-bad", "10.77.42.0/24", &[]);
    let refused = |args: &[&str], want: &str| {
        let o = d.wisp(args);
        assert!(!o.status.success() && out(&o).contains(want), "{args:?}: {}", out(&o));
    };
    refused(&["jit", "add", "-p", "0:7", "echo"], "invalid value '0:7' for '--port");
    refused(&["jit", "add", "-p", "8007:7", "--idle", "1ms", "echo"], "idle_ms 1: must be 10 to");
    refused(&["jit", "add", "-p", "8007:7", "--max-vms", "0", "echo"], "max_vms 0: must be 1 to");
    refused(&["jit", "add", "-p", "8007:7", "no-such-image"], "no-such-image");
    refused(&["jit", "rm", "nope"], "no such just-in-time service: nope");
    // Through the API too: a 400 for a bad body, a 409 for a port in use.
    let mut c = d.client();
    let port = |h, v| wisp_api::PortMap { host: h, vm: v, addr: None };
    let e = c.add_jit(&wisp_api::AddJit { image: "echo".into(), port: port(8007, 0), ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("(400)"), "{e}");
    let ok = c.add_jit(&wisp_api::AddJit { image: "echo".into(), port: port(8007, 7), max_vms: Some(1), ..Default::default() }).unwrap();
    let e = c.add_jit(&wisp_api::AddJit { image: "daytime".into(), port: port(8007, 13), ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("8007") && e.to_string().contains("(409)"), "{e}");
    // Over its VM cap: the second client is turned away, the first served.
    assert_eq!(client(&d, 8007, "127.0.0.2", "one"), "one");
    assert_eq!(client(&d, 8007, "127.0.0.3", "two"), "");
    let s = service(&d, &ok.id);
    assert_eq!((s.boots, s.failed, s.clients.len()), (1, 1, 1), "{s:?}");
    // An image that does not serve the port (noop ends at once): the
    // connection is closed, the VM does not stay, the service goes on.
    let noop = c.add_jit(&wisp_api::AddJit { image: "noop".into(), port: port(8009, 9), ..Default::default() }).unwrap();
    assert_eq!(client(&d, 8009, "127.0.0.2", "hello"), "");
    let s = service(&d, &noop.id);
    assert_eq!((s.failed, s.clients.len()), (1, 0), "{s:?}");
    eventually(Duration::from_secs(10), || format!("noop's VM left: {:?}", d.client().list()), || {
        d.client().list().unwrap().iter().all(|v| v.image != "noop").then_some(())
    });
    assert!(d.log().contains(&format!("jit {}", noop.id)), "the daemon's log says why: {}", d.log());
}
