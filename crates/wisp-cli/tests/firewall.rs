//! Personal firewalls (`guest/apps/firewall`, `wisp run --link`): a VM on
//! the path of one client's traffic, in network namespaces the test makes
//! (the daemon's, where the "internet" is its bridge's gateway, and the
//! client's, whose only interface is the VM's link).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::daemon::Daemon;
use common::{eventually, fresh_dir};

fn out(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A client's network namespace, deleted when dropped.
struct Client {
    name: String,
}

impl Client {
    fn new(tag: &str) -> Client {
        let name = format!("fwc-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(Stdio::null()).status();
        assert!(Command::new("ip").args(["netns", "add", &name]).status().unwrap().success());
        let c = Client { name };
        c.ok(&["ip", "link", "set", "lo", "up"]);
        c
    }

    fn cmd(&self, argv: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(argv);
        c
    }

    fn ok(&self, argv: &[&str]) {
        let o = self.cmd(argv).output().unwrap();
        assert!(o.status.success(), "{argv:?} in {}: {}", self.name, out(&o));
    }

    fn python(&self, script: &str) -> String {
        let o = self.cmd(&["python3", "-c", script]).output().unwrap();
        assert!(o.status.success(), "script failed: {}", out(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn links(&self) -> String {
        out(&self.cmd(&["ip", "-o", "link"]).output().unwrap())
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// A TCP echo server on `addr`:`port` (in the namespace `cmd` runs in),
/// once it listens.
fn echo_server(mut cmd: Command, addr: &str, port: u16) -> Child {
    let script = format!(
        "import socket, threading\n\
         s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('{addr}', {port})); s.listen(16)\n\
         print('listening', flush=True)\n\
         def serve(c):\n    d = c.recv(4096)\n    c.sendall(d); c.close()\n\
         while True:\n    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()\n"
    );
    let mut child = cmd.args(["python3", "-c", &script]).stdout(Stdio::piped()).stdin(Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "listening");
    child
}

/// A UDP sink on `addr`:`port`: says `ready`, then for each line on its
/// input answers how many datagrams (and from which sources) it holds.
fn udp_sink(mut cmd: Command, addr: &str, port: u16) -> (Child, BufReader<std::process::ChildStdout>) {
    let script = format!(
        "import socket, sys\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('{addr}', {port})); s.setblocking(False)\n\
         print('ready', flush=True)\n\
         got = {{}}\n\
         for _ in sys.stdin:\n    \
             while True:\n        \
                 try: d, a = s.recvfrom(2048)\n        \
                 except BlockingIOError: break\n        \
                 got[a[0]] = got.get(a[0], 0) + 1\n    \
             print(sum(got.values()), sorted(got), flush=True)\n"
    );
    let mut child = cmd.args(["python3", "-c", &script]).stdout(Stdio::piped()).stdin(Stdio::piped()).spawn().unwrap();
    let mut r = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    (child, r)
}

fn ask(sink: &mut Child, r: &mut BufReader<std::process::ChildStdout>) -> String {
    sink.stdin.as_mut().unwrap().write_all(b"count\n").unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    line.trim().to_string()
}

/// From the client: connect to `addr`:`port`, send a line, the echo or
/// "failed ..." (1 s to connect).
const CONNECT: &str = "
import socket, sys
s = socket.socket(); s.settimeout(1)
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); s.sendall(b'through the firewall'); print(s.recv(100).decode())
except Exception as e:
    print('failed', type(e).__name__)
";

fn connect(cmd: Command, addr: &str, port: u16) -> String {
    let mut cmd = cmd;
    let o = cmd.args(["python3", "-c", CONNECT, addr, &port.to_string()]).output().unwrap();
    assert!(o.status.success(), "{}", out(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

const RULES: &str = "
# the test client's firewall
default deny
allow out tcp port 7
allow in tcp sport 7
allow out udp port 9 rate 10/s
allow out udp port 10
";

#[test]
fn a_firewall_vm_is_on_the_client_path_and_enforces_its_rules() {
    let d = Daemon::start_in_netns("fw", "10.78.0.0/24", &[]);
    let c = Client::new("a");
    let dir = fresh_dir("fw-rules");
    let rules = dir.join("rules");
    std::fs::write(&rules, RULES).unwrap();
    let link = format!("{}=10.200.3.1/30", c.name);
    let file = format!("{}:/rules", rules.display());
    let o = d.wisp(&["run", "-d", "--name", "fw", "--link", &link, "--file", &file, "firewall"]);
    assert!(o.status.success(), "{}", out(&o));
    let mut api = d.client();
    common::wait_console(&mut api, "fw", "firewall: up, uplink 10.78.0.2/24, client's link 10.200.3.1/30, 4 rules");
    let info = api.get("fw").unwrap();
    assert_eq!(info.links.len(), 1, "{info:?}");
    // The link is the client's only way out; the host routes its subnet
    // through the VM.
    assert!(c.links().contains("eth0"), "{}", c.links());
    let routes = out(&d.in_netns(&["ip", "route"]).output().unwrap());
    assert!(routes.contains("10.200.3.0/30 via 10.78.0.2"), "{routes}");
    c.ok(&["ip", "addr", "add", "10.200.3.2/30", "dev", "eth0"]);
    c.ok(&["ip", "route", "add", "default", "via", "10.200.3.1"]);

    let echo7 = echo_server(d.in_netns(&[]), "10.78.0.1", 7);
    let echo22 = echo_server(d.in_netns(&[]), "10.78.0.1", 22);
    let client_echo = echo_server(c.cmd(&[]), "0.0.0.0", 7);
    // Allowed out, and its answers in.
    assert_eq!(connect(c.cmd(&[]), "10.78.0.1", 7), "through the firewall");
    // Denied: another port out; a connection from outside to the client.
    assert_eq!(connect(c.cmd(&[]), "10.78.0.1", 22), "failed TimeoutError");
    assert_eq!(connect(d.in_netns(&[]), "10.200.3.2", 7), "failed TimeoutError");

    // A rate: 10 datagrams a second (a burst of 10) of 100 sent at once.
    // A source outside the client's subnet: dropped, however allowed the
    // port. The TCP echo after them has come back once the firewall took
    // them all (one ring, in order).
    let (mut sink9, mut r9) = udp_sink(d.in_netns(&[]), "10.78.0.1", 9);
    let (mut sink10, mut r10) = udp_sink(d.in_netns(&[]), "10.78.0.1", 10);
    c.ok(&["ip", "addr", "add", "10.99.9.9/32", "dev", "lo"]);
    c.python(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         for i in range(100): s.sendto(b'x', ('10.78.0.1', 9))\n\
         f = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); f.bind(('10.99.9.9', 0))\n\
         for i in range(20): f.sendto(b'y', ('10.78.0.1', 10))\n\
         s.sendto(b'z', ('10.78.0.1', 10))\n",
    );
    assert_eq!(connect(c.cmd(&[]), "10.78.0.1", 7), "through the firewall");
    let n9: usize = ask(&mut sink9, &mut r9).split(' ').next().unwrap().parse().unwrap();
    assert!((10..=12).contains(&n9), "{n9} of 100 datagrams passed a 10/s rule");
    assert_eq!(ask(&mut sink10, &mut r10), "1 ['10.200.3.2']", "only the client's own datagram");

    // Its counters, as it stops.
    assert!(d.wisp(&["stop", "fw"]).status.success());
    let text = eventually(Duration::from_secs(10), || "no counters".into(), || Some(common::console(&mut api, "fw")).filter(|t| t.contains("counters")));
    let line = text.lines().find(|l| l.contains("firewall: counters")).unwrap();
    let count = |k: &str| -> u64 { line.split(' ').skip_while(|w| *w != k).nth(1).unwrap().parse().unwrap() };
    assert!(count("denied") >= 2 && count("spoofed") >= 20 && count("over_rate") >= 88 && count("out") >= 12, "{line}");

    // Gone with the VM: the route, the client's link.
    assert!(d.wisp(&["rm", "-f", "fw"]).status.success());
    eventually(Duration::from_secs(10), || format!("left: {}", c.links()), || (!c.links().contains("eth0")).then_some(()));
    let routes = out(&d.in_netns(&["ip", "route"]).output().unwrap());
    assert!(!routes.contains("10.200.3.0/30"), "{routes}");
    for mut ch in [echo7, echo22, client_echo, sink9, sink10] {
        let _ = ch.kill();
        let _ = ch.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn links_and_rules_that_cannot_be_are_refused_and_leave_nothing() {
    // Link subnets anywhere in 10/8, the daemon's own VM subnet included.
    let d = Daemon::start_in_netns("fw-bad", "10.79.0.0/24", &["--link-subnets", "10.0.0.0/8"]);
    let c = Client::new("b");
    let dir = fresh_dir("fw-bad");
    let (good, bad) = (dir.join("good"), dir.join("bad"));
    std::fs::write(&good, "allow icmp\n").unwrap();
    std::fs::write(&bad, "allow icmp\nallow tcp port 99999\n").unwrap();
    let file = |p: &std::path::Path| format!("{}:/rules", p.display());
    let run = |link: &str, rules: &std::path::Path| d.wisp(&["run", "--link", link, "--file", &file(rules), "firewall"]);

    let o = run("no-such-ns-here=10.201.0.1/30", &good);
    assert!(!o.status.success() && out(&o).contains("ip netns add no-such-ns-here"), "{}", out(&o));
    let o = run(&format!("{}=10.79.0.9/30", c.name), &good);
    assert!(!o.status.success() && out(&o).contains("overlaps the daemon's VM subnet"), "{}", out(&o));
    let o = run(&format!("{}=10.201.0.0/30", c.name), &good);
    assert!(!o.status.success() && out(&o).contains("a host address and its prefix"), "{}", out(&o));
    let o = run(&format!("{}:bad/name=10.201.0.1/30", c.name), &good);
    assert!(!o.status.success() && out(&o).contains("an interface name"), "{}", out(&o));
    // Malformed rules: the VM says which line and why, and ends with 2.
    let o = run(&format!("{}=10.201.0.1/30", c.name), &bad);
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
    assert!(out(&o).contains("firewall: /rules: line 2: '99999' is no port"), "{}", out(&o));
    // One NIC is not enough.
    let o = d.wisp(&["run", "--net", "--file", &file(&good), "firewall"]);
    assert!(!o.status.success() && out(&o).contains("('client')"), "{}", out(&o));

    // Only inside the daemon's link subnets: no request routes the host's
    // own networks through a VM.
    let o = run(&format!("{}=192.168.77.1/30", c.name), &good);
    assert!(!o.status.success() && out(&o).contains("outside the daemon's link subnets 10.0.0.0/8"), "{}", out(&o));

    // A subnet is one VM's; a namespace's name one link's.
    let o = d.wisp(&["run", "-d", "--name", "one", "--link", &format!("{}=10.201.0.1/30", c.name), "--file", &file(&good), "firewall"]);
    assert!(o.status.success(), "{}", out(&o));
    // Not saved nor moved (a restore gets one NIC; the taps are this host's).
    let snap = dir.join("one.snap");
    let o = d.wisp(&["snapshot", "one", snap.to_str().unwrap()]);
    assert!(!o.status.success() && out(&o).contains("a VM with links cannot be saved yet"), "{}", out(&o));
    assert!(!snap.exists());
    let o = run(&format!("{}:eth1=10.201.0.1/29", c.name), &good);
    assert!(!o.status.success() && out(&o).contains("overlaps a link of VM"), "{}", out(&o));
    let o = run(&format!("{}=10.202.0.1/30", c.name), &good);
    assert!(!o.status.success() && out(&o).contains("has an interface \"eth0\" already"), "{}", out(&o));
    assert!(d.wisp(&["rm", "-f", "one"]).status.success());

    // Nothing left: no taps in the daemon's namespace, no routes, one
    // interface (lo) in the client's.
    eventually(Duration::from_secs(10), || format!("left: {}", c.links()), || (!c.links().contains("eth0")).then_some(()));
    let routes = out(&d.in_netns(&["ip", "route"]).output().unwrap());
    assert!(!routes.contains("10.20"), "{routes}");
    let links = out(&d.in_netns(&["ip", "-o", "link"]).output().unwrap());
    assert!(!links.contains(" wl"), "{links}");
    let _ = std::fs::remove_dir_all(&dir);
}
