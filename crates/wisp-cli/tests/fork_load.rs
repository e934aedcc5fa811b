//! Fork under load: a VM forks again and again while its NIC's I/O thread
//! moves traffic on another connection and its console is busy with the
//! children's output. Every fork completes, every child writes its whole
//! snapshot, and the parent keeps serving: the forked child takes no lock
//! another thread of the monitor may have held at the fork.

mod common;

use std::time::Duration;

use common::netns::{Console, NetNs};

#[test]
fn a_vm_forks_forty_times_while_serving_traffic_and_printing() {
    let ns = NetNs::new("forkload");
    ns.add_tap("wtap0", "10.77.11.1/24");
    let mut vm = ns.boot("wtap0", "10.77.11.2/24", "kvstore", &["6380"]);
    let console = Console::of(&mut vm);
    console.wait_for("kvstore: listening on 10.77.11.2:6380", Duration::from_secs(20));
    let client = r#"
import socket, threading, time
def connect():
    s = socket.create_connection(("10.77.11.2", 6380), timeout=10)
    return s, s.makefile("rw")
s, f = connect()
def cmd(c):
    f.write(c + "\n"); f.flush()
    return f.readline().strip()
for i in range(200):
    assert cmd("SET k%03d v%d" % (i, i)) == "OK"
stop = threading.Event()
served = [0]
def hammer():
    # Traffic through the NIC for as long as the forks go on.
    s2, f2 = connect()
    while not stop.is_set():
        f2.write("GET k007\n"); f2.flush()
        assert f2.readline().strip() == "VALUE v7"
        served[0] += 1
t = threading.Thread(target=hammer)
t.start()
for n in range(1, 41):
    r = cmd("BGSAVE")
    assert r.startswith("OK saving in "), (n, r)
    deadline = time.time() + 20
    while cmd("LASTSAVE") != "saves %d running 0 last ok" % n:
        assert time.time() < deadline, (n, cmd("LASTSAVE"))
stop.set()
t.join(20)
assert not t.is_alive()
assert served[0] > 40, served[0]
print("ok", served[0])
"#;
    let o = ns.cmd(&["timeout", "120", "python3", "-c", client]).output().unwrap();
    let said = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success() && said.starts_with("ok "), "{said} {}", String::from_utf8_lossy(&o.stderr));
    let _ = vm.kill();
    let _ = vm.wait();
    let lines = console.rest(Duration::from_secs(20));
    let begins = lines.iter().filter(|l| l.as_str() == "kvstore: snapshot begin 200").count();
    let ends = lines.iter().filter(|l| l.starts_with("kvstore: snapshot end 200 ")).count();
    assert_eq!((begins, ends), (40, 40), "{}", lines.join("\n"));
}
