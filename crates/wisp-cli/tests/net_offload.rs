//! NIC offloads (ABI v4) on real KVM, in a network namespace each test
//! creates: the tap carries super-frames both ways (the host's GSO/GRO
//! frames into the VM, the VM's coalesced segments out), and a guest that
//! writes bogus virtio-net headers or chains, or stops taking RX frames,
//! loses at most its own NIC — the host's tap and bridge and a neighbour
//! VM carry on.

mod common;

use std::process::{Child, Stdio};
use std::time::Duration;

use common::netns::{Console, NetNs};

/// TCP data through the neighbour's echo server (TCP port 7), from the
/// namespace: 200 KiB there and back.
const ECHO: &str = r#"
import socket, sys
payload = bytes(range(256)) * 800
s = socket.create_connection((sys.argv[1], 7), timeout=10)
s.sendall(payload)
s.shutdown(socket.SHUT_WR)
got = b""
while True:
    d = s.recv(65536)
    if not d: break
    got += d
assert got == payload, (len(got), len(payload))
print("ok")
"#;

fn echo_ok(ns: &NetNs, ip: &str) {
    let out = ns.cmd(&["python3", "-c", ECHO, ip]).output().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "the neighbour at {ip} does not echo: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ping_ok(ns: &NetNs, ip: &str) {
    let ping = ns.cmd(&["busybox", "ping", "-c", "2", "-W", "2", ip]).output().unwrap();
    assert!(ping.status.success(), "ping {ip}: {}", String::from_utf8_lossy(&ping.stdout));
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A bridge with two taps: the hostile VM's (a) and its neighbour's (b),
/// the neighbour an echo server.
fn bridge_with_neighbour(tag: &str, net: &str) -> (NetNs, Child) {
    let ns = NetNs::new(tag);
    ns.add_bridge("wbr0", &format!("{net}.1/24"));
    ns.add_bridged_tap("wtapa", "wbr0");
    ns.add_bridged_tap("wtapb", "wbr0");
    let mut neighbour = ns.boot("wtapb", &format!("{net}.3/24"), "echo", &[]);
    Console::of(&mut neighbour).wait_for("echo: listening", Duration::from_secs(20));
    (ns, neighbour)
}

#[test]
fn bogus_offload_headers_and_chains_lose_only_that_nic() {
    let (ns, neighbour) = bridge_with_neighbour("offhdr", "10.77.13");
    // Each case: the reason the monitor gives for stopping the NIC.
    let cases = [
        ("gso-type", "gso_type 0x5 is not an offload of this NIC"),
        ("gso-ecn", "gso_type 0x81 is not an offload of this NIC"),
        ("gso-size", "gso_size 9000"),
        ("gso-size-zero", "gso_size 0"),
        ("hdr-len", "hdr_len 14000"),
        ("csum-start", "csum_start 60000"),
        ("csum-offset", "csum_offset 14470"),
        ("flags", "header flags 0xff"),
        ("frame-len", "a 3000-byte frame without GSO"),
        ("chain-past-prod", "takes 8 slots and only 3 are queued (the chain leaves the ring)"),
        ("chain-loop", "length 1048577"),
        ("chain-long", "length 65550"),
    ];
    for (case, reason) in cases {
        let vm = ns.boot("wtapa", "10.77.13.2/24", "hostile", &["net-offload", case]);
        let out = vm.wait_with_output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{case}: {stdout} {stderr}");
        assert!(stdout.contains(&format!("net-offload {case}: nic stopped = 1, guest still running")), "{case}: {stdout} {stderr}");
        assert!(stderr.contains("wisp: NIC stopped: TX slot") && stderr.contains(reason), "{case}: expected '{reason}' in {stderr}");
        // The host's bridge and the neighbour carry on.
        echo_ok(&ns, "10.77.13.3");
    }
    ping_ok(&ns, "10.77.13.3");
    stop(neighbour);
}

#[test]
fn a_guest_that_stops_taking_rx_frames_harms_no_one() {
    let (ns, neighbour) = bridge_with_neighbour("offstall", "10.77.14");
    let mut vm = ns.boot("wtapa", "10.77.14.2/24", "hostile", &["net-rx-stall", "6"]);
    let console = Console::of(&mut vm);
    console.wait_for("net-rx-stall: not reading", Duration::from_secs(20));
    // It answers no ARP: the host is told its MAC (wisp's rule, 52:54:00
    // and the address's last three bytes). The bridge has not learnt it
    // (the VM sends nothing) and floods its frames to the neighbour too.
    ns.exec_ok(&["ip", "neigh", "replace", "10.77.14.2", "lladdr", "52:54:00:4d:0e:02", "dev", "wbr0", "nud", "permanent"]);
    // Flood it for 2 s (UDP, 1400-byte datagrams, and TCP SYNs), with the
    // neighbour in use meanwhile: its RX ring fills, the tap's queue
    // drops, nothing else notices.
    let flood = r#"
import socket, time
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end, n = time.time() + 2, 0
while time.time() < end:
    try:
        u.sendto(b"x" * 1400, ("10.77.14.2", 9)); n += 1
    except OSError:
        pass
for _ in range(5):
    s = socket.socket(); s.setblocking(False)
    try: s.connect(("10.77.14.2", 7))
    except OSError: pass
print(n)
"#;
    let flooder = ns.cmd(&["python3", "-c", flood]).stdout(Stdio::piped()).spawn().unwrap();
    echo_ok(&ns, "10.77.14.3");
    let sent: u64 = String::from_utf8_lossy(&flooder.wait_with_output().unwrap().stdout).trim().parse().unwrap_or(0);
    assert!(sent > 2000, "the flood sent {sent} datagrams");
    echo_ok(&ns, "10.77.14.3");
    ping_ok(&ns, "10.77.14.3");
    // The stalled VM: its RX ring full as far as the monitor fills it, its
    // NIC still there, and it ends as it wants.
    let lines = console.wait_for("net-rx-stall: ", Duration::from_secs(20));
    let last = lines.last().unwrap();
    assert!(last.ends_with("nic stopped = 0"), "{last}");
    let waiting: u32 = last.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(waiting > 400, "only {waiting} RX slots were filled: {last}");
    assert_eq!(vm.wait().unwrap().code(), Some(0));
    stop(neighbour);
}

/// Packets and bytes the host side of `tap` has sent (to the VM) and
/// received (from it): (tx packets, tx bytes, rx packets, rx bytes).
fn tap_counters(ns: &NetNs, tap: &str) -> [u64; 4] {
    ["tx_packets", "tx_bytes", "rx_packets", "rx_bytes"].map(|what| {
        let path = format!("/sys/class/net/{tap}/statistics/{what}");
        let out = ns.cmd(&["cat", &path]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|_| panic!("{path}: {out:?}"))
    })
}

#[test]
fn tcp_crosses_the_tap_in_super_frames_both_ways() {
    // The kernel counts a super-frame once on the tap: with offloads, the
    // frames that carry a TCP stream average far over the MTU's 1,514
    // bytes in each direction (the host's TSO/GRO frames into the VM, the
    // VM's coalesced segments out of it). Without, they average under it.
    let ns = NetNs::new("offsize");
    ns.add_tap("wtap0", "10.77.15.1/24");
    let mut vm = ns.boot("wtap0", "10.77.15.2/24", "iperf", &[]);
    Console::of(&mut vm).wait_for("iperf: listening on 10.77.15.2:5201", Duration::from_secs(20));
    for (args, dir) in [(&["-t", "2"][..], "into the VM"), (&["-t", "2", "-R"][..], "out of the VM")] {
        let before = tap_counters(&ns, "wtap0");
        let mut argv = vec!["timeout", "30", "iperf3", "-c", "10.77.15.2"];
        argv.extend_from_slice(args);
        let out = ns.cmd(&argv).output().unwrap();
        assert!(out.status.success(), "iperf3 {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let after = tap_counters(&ns, "wtap0");
        let d: Vec<u64> = (0..4).map(|i| after[i] - before[i]).collect();
        let (packets, bytes) = if args.contains(&"-R") { (d[2], d[3]) } else { (d[0], d[1]) };
        let average = bytes / packets.max(1);
        eprintln!("{dir}: {bytes} bytes in {packets} frames, {average} bytes a frame");
        assert!(bytes > 10_000_000, "{dir}: only {bytes} bytes crossed");
        assert!(average > 8_000, "{dir}: {average} bytes a frame: no super-frames");
    }
    stop(vm);
}
