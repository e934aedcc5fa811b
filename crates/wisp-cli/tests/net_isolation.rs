//! A tenant cannot speak for anyone else on the wire: frames leave a VM's
//! NIC only with its own MAC and IPv4 address, and a guest cannot make the
//! monitor send a frame twice by rewinding the monitor's ring index.
//! A sniffer on the host side of the tap (in a namespace this test makes)
//! sees what really left the VM.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::netns::{Console, NetNs};

/// Sniff `tap` until a frame carrying "DONE" (or 30 s): prints "ready",
/// then one line per tagged frame seen.
const SNIFFER: &str = r#"
import socket, sys, time
tap, guest_ip, gw = sys.argv[1], bytes(map(int, sys.argv[2].split("."))), bytes(map(int, sys.argv[3].split(".")))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind((tap, 0))
s.settimeout(0.5)
print("ready", flush=True)
deadline = time.time() + 30
while time.time() < deadline:
    try:
        f, addr = s.recvfrom(4096)
    except socket.timeout:
        continue
    if addr[2] == socket.PACKET_OUTGOING:
        continue  # the host's own frames towards the VM
    for tag in (b"SPOOF-MAC", b"SPOOF-IP", b"SPOOF-V6", b"GOOD", b"DONE"):
        if tag in f:
            print(tag.decode(), flush=True)
    if f[12:14] == b"\x08\x06" and f[28:32] == gw:
        print("SPOOF-ARP", flush=True)
    if b"DONE" in f:
        break
print("end", flush=True)
"#;

#[test]
fn frames_leave_a_vm_only_under_its_own_identity_and_once() {
    let ns = NetNs::new("spoof");
    ns.add_tap("wtap0", "10.77.12.1/24");
    let mut sniffer = ns
        .cmd(&["python3", "-c", SNIFFER, "wtap0", "10.77.12.2", "10.77.12.1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = BufReader::new(sniffer.stdout.take().unwrap());
    let mut line = String::new();
    seen.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "sniffer did not start");
    let wisp = env!("CARGO_BIN_EXE_wisp");
    let argv = [wisp, "run", "--timeout", "30s", "--tap", "wtap0", "--ip", "10.77.12.2/24", "--gw", "10.77.12.1", "hostile", "--", "net-spoof"];
    let mut vm = common::direct(&mut ns.cmd(&argv)).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let console = Console::of(&mut vm);
    console.wait_for("net-spoof: sent", Duration::from_secs(30));
    let st = sniffer.wait().unwrap();
    let mut tags = Vec::new();
    for l in seen.lines() {
        let l = l.unwrap();
        if l != "end" {
            tags.push(l);
        }
    }
    let _ = vm.kill();
    let _ = vm.wait();
    assert!(st.success(), "sniffer failed");
    assert_eq!(tags, ["GOOD", "DONE"], "frames seen on the host side of the tap");
}
