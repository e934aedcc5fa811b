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
    let client = format!("{}{}", common::PY_RESP, r#"
import threading, time
c = connect("10.77.11.2", 6380)
for i in range(200):
    assert cmd(c, "SET", "k%03d" % i, "v%d" % i) == "OK"
stop = threading.Event()
served = [0]
def hammer():
    # Traffic through the NIC for as long as the forks go on.
    c2 = connect("10.77.11.2", 6380)
    while not stop.is_set():
        assert cmd(c2, "GET", "k007") == "v7"
        served[0] += 1
t = threading.Thread(target=hammer)
t.start()
for n in range(1, 41):
    r = cmd(c, "BGSAVE")
    assert r == "Background saving started", (n, r)
    deadline = time.time() + 20
    while True:
        p = info(c, "persistence")
        if p["rdb_saves"] == str(n) and p["rdb_bgsave_in_progress"] == "0" and p["rdb_last_bgsave_status"] == "ok":
            break
        assert time.time() < deadline, (n, p)
stop.set()
t.join(20)
assert not t.is_alive()
assert served[0] > 40, served[0]
print("ok", served[0])
"#);
    let o = ns.cmd(&["timeout", "120", "python3", "-c", &client]).output().unwrap();
    let said = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success() && said.starts_with("ok "), "{said} {}", String::from_utf8_lossy(&o.stderr));
    let _ = vm.kill();
    let _ = vm.wait();
    let lines = console.rest(Duration::from_secs(20));
    let begins = lines.iter().filter(|l| l.as_str() == "kvstore: snapshot begin 200").count();
    let ends = lines.iter().filter(|l| l.starts_with("kvstore: snapshot end 200 ")).count();
    assert_eq!((begins, ends), (40, 40), "{}", lines.join("\n"));
}
