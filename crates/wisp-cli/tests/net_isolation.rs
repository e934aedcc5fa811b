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

/// Run Debian's iperf3 client in `ns` against `server` and return
/// (receiver bits/s, datagrams received for UDP or 0).
fn iperf3(ns: &NetNs, server: &str, args: &[&str]) -> (f64, f64) {
    iperf3_in(|argv| ns.cmd(argv), server, args)
}

/// [`iperf3`], run by the command `cmd` makes of its argument vector.
fn iperf3_in(cmd: impl Fn(&[&str]) -> std::process::Command, server: &str, args: &[&str]) -> (f64, f64) {
    let mut argv = vec!["timeout", "30", "iperf3", "-c", server, "--json"];
    argv.extend_from_slice(args);
    let out = cmd(&argv).output().expect("run iperf3 (apt-get install iperf3)");
    let json = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "iperf3 {args:?}: {json} {}", String::from_utf8_lossy(&out.stderr));
    let extract = r#"
import json, sys
e = json.load(sys.stdin)["end"]
if "packets" in e.get("sum", {}):
    # UDP: "sum" is the receiver's view (the client's with -R).
    s = e["sum"]
    print(s["bits_per_second"], s["packets"] - s["lost_packets"])
else:
    print(e["sum_received"]["bits_per_second"], 0)
"#;
    let mut py = std::process::Command::new("python3").args(["-c", extract]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut py.stdin.take().unwrap(), json.as_bytes()).unwrap();
    let parsed = String::from_utf8_lossy(&py.wait_with_output().unwrap().stdout).into_owned();
    let v: Vec<f64> = parsed.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    assert_eq!(v.len(), 2, "{parsed} {json}");
    (v[0], v[1])
}

/// Boot the iperf app in a new namespace `tag` (subnet 10.77.`net`.0/24)
/// with `--net-rate rate`.
fn limited_iperf(tag: &str, net: u8, rate: &str) -> (NetNs, std::process::Child, String) {
    let ns = NetNs::new(tag);
    ns.add_tap("wtap0", &format!("10.77.{net}.1/24"));
    let wisp = env!("CARGO_BIN_EXE_wisp");
    let cidr = format!("10.77.{net}.2/24");
    let argv = [wisp, "run", "--timeout", "60s", "--tap", "wtap0", "--ip", &cidr, "--net-rate", rate, "iperf"];
    let mut vm = common::direct(&mut ns.cmd(&argv)).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let console = Console::of(&mut vm);
    let server = format!("10.77.{net}.2");
    console.wait_for(&format!("iperf: listening on {server}:5201"), Duration::from_secs(20));
    (ns, vm, server)
}

#[test]
fn a_nics_byte_rate_limit_holds_in_both_directions() {
    // 1 MiB/s each way.
    let (ns, mut vm, server) = limited_iperf("rate", 13, "1M");
    let limit_bps = (1u64 << 20) as f64 * 8.0;
    // Into the VM (its RX), and out of it (-R: its TX). The budget allows a
    // 100 ms burst on top of the rate (over 3 s at most ~1.04x); TCP
    // reaches a good part of it.
    for dir in [&["-t", "3"][..], &["-t", "3", "-R"][..]] {
        let (bps, _) = iperf3(&ns, &server, dir);
        eprintln!("{dir:?}: {bps:.0} bit/s (limit {limit_bps})");
        assert!(bps <= limit_bps * 1.15, "{dir:?}: {bps} bit/s over the {limit_bps} limit");
        assert!(bps >= limit_bps * 0.5, "{dir:?}: {bps} bit/s: the limited link should still carry traffic");
    }
    let _ = vm.kill();
    let _ = vm.wait();
}

#[test]
fn a_nics_frame_rate_limit_holds_a_flood_of_small_datagrams() {
    // Bytes unlimited in effect (100 MiB/s), 400 frames/s each way.
    let (ns, mut vm, server) = limited_iperf("pps", 14, "100M/400");
    // The VM floods small datagrams for 3 s (-R: 20 Mbit/s of 100-byte
    // packets, ~75,000 in all): they leave at the frame rate. At most 3 s
    // of it, the 100 ms burst and what waits in the TX ring (256 slots)
    // when the sender stops, and 5 % for timing.
    let (_, got) = iperf3(&ns, &server, &["-t", "3", "-u", "-R", "-b", "20M", "-l", "100"]);
    let most = (400.0 * 3.0 + 40.0 + 256.0) * 1.05;
    eprintln!("UDP flood: {got} datagrams in 3 s (at most {most})");
    assert!(got <= most, "{got} datagrams in 3 s through a 400 frames/s limit (at most {most})");
    assert!(got >= 300.0, "{got} datagrams: the limited link should still carry traffic");
    let _ = vm.kill();
    let _ = vm.wait();
}

#[test]
fn a_rate_limit_asked_of_wispd_holds() {
    use wisp_api::client::ApiError;
    use wisp_api::{CreateVm, NetRate};
    let d = common::daemon::Daemon::start_in_netns("netrate", "10.89.0.0/24", &[]);
    let mut c = d.client();
    let rate = NetRate { bytes_per_sec: 1 << 20, frames_per_sec: 0 };
    // A limit needs a NIC.
    let r = c.create(&CreateVm { image: "iperf".into(), net_rate: Some(rate), ..Default::default() });
    assert!(matches!(r, Err(ApiError::Status(400, ref m)) if m.contains("net_rate needs a NIC")), "{r:?}");
    let vm = c.create(&CreateVm { image: "iperf".into(), net: true, net_rate: Some(rate), ..Default::default() }).unwrap();
    let ip = vm.ip.clone().expect("a NIC");
    common::wait_console(&mut c, &vm.id, &format!("iperf: listening on {ip}:5201"));
    let limit_bps = (1u64 << 20) as f64 * 8.0;
    let (bps, _) = iperf3_in(|argv| d.in_netns(argv), &ip, &["-t", "3"]);
    eprintln!("through wispd: {bps:.0} bit/s (limit {limit_bps})");
    assert!(bps <= limit_bps * 1.15 && bps >= limit_bps * 0.5, "{bps} bit/s against a {limit_bps} limit");
}
