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
    // of it, the 100 ms burst and what waits in the TX ring (its slots:
    // 256 before ABI v4, 512 since) when the sender stops, and 5 % for
    // timing.
    let (_, got) = iperf3(&ns, &server, &["-t", "3", "-u", "-R", "-b", "20M", "-l", "100"]);
    let most = (400.0 * 3.0 + 40.0 + wisp_abi::net::SLOTS as f64) * 1.05;
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

/// The isolation flag of VM `id`'s bridge port, as the kernel reports it
/// ("1" isolated, "0" not).
fn port_isolated(d: &common::daemon::Daemon, id: &str) -> String {
    let path = format!("/sys/class/net/wt{id}/brport/isolated");
    let o = d.in_netns(&["cat", &path]).output().unwrap();
    assert!(o.status.success(), "{path}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Send `msg` from the host side of the bridge (the gateway) to the echo
/// service at `ip`; what came back.
fn echo_from_gateway(d: &common::daemon::Daemon, ip: &str, msg: &str) -> String {
    d.python(&format!(
        "import socket; s=socket.create_connection(('{ip}',7),timeout=5); s.sendall(b'{msg}'); s.shutdown(socket.SHUT_WR); print(s.recv(100).decode())"
    ))
    .trim()
    .to_string()
}

/// An echo VM on wispd's bridge (`net_peers` as `peers`) with `args`.
fn echo_vm(args: &[&str], peers: bool) -> wisp_api::CreateVm {
    wisp_api::CreateVm {
        image: "echo".into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        net: true,
        net_peers: peers,
        ..Default::default()
    }
}

/// An echo server on wispd's bridge, listening: it and its address.
fn echo_server(c: &mut wisp_api::client::Client, peers: bool) -> (wisp_api::VmInfo, String) {
    let v = c.create(&echo_vm(&[], peers)).unwrap();
    let ip = v.ip.clone().expect("a NIC");
    common::wait_console(c, &v.id, &format!("echo: listening on {ip}:7"));
    assert_eq!(v.net_peers, peers);
    (v, ip)
}

/// An echo client VM sending "vm-to-vm" to `server`, ended after
/// `timeout_ms`: its exit code and console.
fn echo_client(c: &mut wisp_api::client::Client, server: &str, peers: bool, timeout_ms: u64) -> (i32, String) {
    let req = wisp_api::CreateVm { timeout_ms: Some(timeout_ms), ..echo_vm(&["client", server, "7", "vm-to-vm"], peers) };
    let v = c.create(&req).unwrap();
    let code = c.wait(&v.id).unwrap().code;
    (code, common::console(c, &v.id))
}

#[test]
fn vms_on_wispds_bridge_reach_each_other_only_when_they_ask_for_it() {
    use wisp_api::client::ApiError;
    let d = common::daemon::Daemon::start_in_netns("netiso", "10.88.0.0/24", &["--pool", "16M=2"]);
    let mut c = d.client();
    // Opening a port needs a port.
    let r = c.create(&wisp_api::CreateVm { net: false, ..echo_vm(&[], true) });
    assert!(matches!(r, Err(ApiError::Status(400, ref m)) if m == "net_peers needs a NIC: ask for net or ports too"), "{r:?}");
    // Two VMs as asked by default: each port isolated; the gateway reaches both.
    let ((a, a_ip), (b, b_ip)) = (echo_server(&mut c, false), echo_server(&mut c, false));
    for (v, ip) in [(&a, &a_ip), (&b, &b_ip)] {
        assert_eq!(port_isolated(&d, &v.id), "1", "{}'s port", v.id);
        assert_eq!(echo_from_gateway(&d, ip, "from-the-gateway"), "from-the-gateway");
    }
    // A third isolated VM connects to A and B: nothing gets through (its
    // ARP requests reach no other isolated port); the VM is ended by its timeout.
    for server in [&a_ip, &b_ip] {
        let (code, out) = echo_client(&mut c, server, false, 3000);
        assert_ne!(code, 0, "an isolated VM reached {server}: {out}");
        assert!(!out.contains("echo: reply"), "{out}");
    }
    // The gateway still reaches both.
    assert_eq!(echo_from_gateway(&d, &a_ip, "still"), "still");
    assert_eq!(echo_from_gateway(&d, &b_ip, "still"), "still");

    // With net_peers the port stays open: two such VMs talk.
    let (p, p_ip) = echo_server(&mut c, true);
    assert_eq!(port_isolated(&d, &p.id), "0");
    let (code, out) = echo_client(&mut c, &p_ip, true, 20_000);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("echo: reply: vm-to-vm"), "{out}");
    // And, as the kernel's flag goes (only isolated-to-isolated is
    // blocked), an isolated VM reaches an open one too (docs/networking.md).
    let (code, out) = echo_client(&mut c, &p_ip, false, 20_000);
    assert_eq!(code, 0, "{out}");
    assert_eq!(echo_from_gateway(&d, &p_ip, "gw"), "gw");

    // The same from the command line.
    let o = d.wisp(&["run", "-d", "--net", "--net-peers", "echo"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(c.get(&id).unwrap().net_peers);
    assert_eq!(port_isolated(&d, &id), "0");
    let o = d.wisp(&["run", "-d", "--net-peers", "echo"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--net-peers opens a NIC's bridge port"), "{o:?}");
}
