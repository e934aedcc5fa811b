//! The warm path on real KVM: the pool's shells hold the image last asked
//! for loaded ahead (and a create of it loads nothing), a shell holding
//! another image still runs any image correctly, and an attached create is
//! answered by the VMM process on the client's own connection (errors
//! before that by the daemon).

mod common;

use common::daemon::Daemon;
use common::eventually;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use wisp_api::client::{ApiError, Client};
use wisp_api::{BootTrace, CreateVm, PoolImage, VmInfo};

const MEM: u64 = 16 << 20;
const TEN: Duration = Duration::from_secs(10);

/// Create `image` attached; its console and the VM as the daemon lists it.
fn run(c: &mut Client, image: &str, args: &[&str]) -> (String, VmInfo) {
    let req =
        CreateVm { image: image.into(), args: args.iter().map(|s| s.to_string()).collect(), ..Default::default() };
    let mut out = Vec::new();
    let id = c.create_attached(&req, &mut |d| {
        out.extend_from_slice(d);
        true
    });
    let id = id.unwrap_or_else(|e| panic!("create {image}: {e}"));
    // The response ended with the VM's exit status (a trailer): no `wait`.
    let told = c.attached_exit().unwrap_or_else(|| panic!("{image}: no X-Wisp-Exit trailer"));
    assert_eq!(told, c.wait(&id).unwrap(), "{image}");
    (String::from_utf8_lossy(&out).into_owned(), c.get(&id).unwrap())
}

/// VM `id`'s boot trace once it is complete. The daemon records it as the
/// VMM process answers, which may be after the client has read the whole
/// console (the VMM process writes to the client itself): poll.
fn trace(d: &Daemon, id: &str) -> BootTrace {
    let mut c = d.client();
    let what = || format!("no complete trace in {:?}", d.client().get(id));
    eventually(TEN, what, || c.get(id).ok()?.boot_trace.filter(|t| t.first_output_ns.is_some()))
}

/// Wait until the pool's ready shells all hold `image` loaded ahead.
fn all_loaded(d: &Daemon, image: &str, count: u32) {
    let want = vec![PoolImage { mem: MEM, image: image.into(), count }];
    let mut c = d.client();
    let what = || format!("the pool is not all {image}: {:?}", d.client().pool());
    eventually(TEN, what, || (c.pool().ok()?.loaded == want).then_some(()));
}

#[test]
fn the_pool_loads_the_likely_image_ahead_and_any_image_still_runs() {
    let d = Daemon::start("warm-preload", &["--pool", "16M=2"]);
    let mut c = d.client();
    // The first hello finds plain shells; from then on the pool holds hello.
    let (out, vm) = run(&mut c, "hello", &["one"]);
    assert!(out.starts_with("Hello from wisp! args: [\"one\"]"), "{out}");
    assert!(!trace(&d, &vm.id).preloaded);
    all_loaded(&d, "hello", 2);
    let (out, vm) = run(&mut c, "hello", &["two"]);
    assert!(out.starts_with("Hello from wisp! args: [\"two\"]"), "{out}");
    let t = trace(&d, &vm.id);
    assert!(t.preloaded, "{t:?}");
    let first = t.first_output_ns.unwrap();
    assert!(t.arrived_ns <= t.sent_ns && t.sent_ns <= t.received_ns && t.received_ns <= t.entered_ns, "{t:?}");
    assert!(t.entered_ns <= first, "{t:?}");
    // Another image (noop cannot fork: the hello shells are sealed to
    // hello) is started in a new shell, and becomes the likely one.
    let (out, vm) = run(&mut c, "noop", &[]);
    assert_eq!(out, "");
    assert_eq!(c.wait(&vm.id).unwrap().code, 0);
    all_loaded(&d, "noop", 2);
    // A forking image's shells are not sealed: hello runs in one of them,
    // cleared of the image it held and on a new KVM VM.
    let (out, _) = run(&mut c, "family", &["usage"]);
    assert!(out.contains("usage: family MODE"), "{out}");
    all_loaded(&d, "family", 2);
    let (out, vm) = run(&mut c, "hello", &["three"]);
    assert!(out.starts_with("Hello from wisp! args: [\"three\"]"), "{out}");
    assert!(!trace(&d, &vm.id).preloaded);
    assert_eq!(c.wait(&vm.id).unwrap().code, 0);
}

#[test]
fn an_attached_create_is_answered_by_the_vmm_process_and_refusals_by_the_daemon() {
    let d = Daemon::start("warm-attach", &["--pool", "16M=1"]);
    // Raw HTTP: the head says the connection closes after the console,
    // which ends with the last chunk.
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(TEN)).unwrap();
    let body = r#"{"image":"hello","args":["raw"]}"#;
    write!(s, "POST /v1/vms?attach=true HTTP/1.1\r\nHost: wisp\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        .unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    let (head, rest) = all.split_once("\r\n\r\n").expect("a head");
    assert!(head.starts_with("HTTP/1.1 201"), "{head}");
    assert!(head.contains("Connection: close") && head.contains("Transfer-Encoding: chunked"), "{head}");
    assert!(head.to_ascii_lowercase().contains("x-wisp-vm-id: "), "{head}");
    // ... and the last chunk carries the exit status as trailer fields.
    assert!(rest.contains("Hello from wisp! args: [\"raw\"]\n") && rest.ends_with("\r\n0\r\nX-Wisp-Exit: 0\r\nX-Wisp-Exit-Reason: exited\r\n\r\n"), "{rest:?}");
    // A start the VMM process refuses (daytime needs a NIC) is answered
    // by the daemon on the connection it handed over, with the reason.
    let mut c = d.client();
    let req = CreateVm { image: "daytime".into(), ..Default::default() };
    let r = c.create_attached(&req, &mut |_| true);
    assert!(matches!(r, Err(ApiError::Status(400, ref m)) if m.contains("needs a net device")), "{r:?}");
    assert!(c.list().unwrap().iter().all(|v| v.image != "daytime"), "rolled back");
    // And the same client goes on (a new connection after the closed one).
    let (out, _) = run(&mut c, "hello", &["again"]);
    assert!(out.starts_with("Hello from wisp! args: [\"again\"]"), "{out}");
}

/// The start is answered once the guest has first run, at its first exit
/// (`wisp-vmm-process` `sink.rs`): a guest that makes none, printing
/// nothing, is answered all the same (a timer brings it back to the
/// monitor), its control socket is served, and it is killed on request.
#[test]
fn a_guest_that_never_leaves_the_guest_is_answered_served_and_killed() {
    let d = Daemon::start("warm-quiet", &["--pool", "16M=1"]);
    let mut c = d.client();
    let req = CreateVm { image: "hostile".into(), args: vec!["spin-quiet".into()], ..Default::default() };
    let t = std::time::Instant::now();
    let vm = c.create(&req).expect("create");
    assert!(t.elapsed() < Duration::from_secs(5), "answered after {:?}", t.elapsed());
    assert_eq!(vm.state, wisp_api::VmState::Running);
    // Its control socket went to its thread: a pause and a resume.
    c.pause(&vm.id).expect("pause");
    assert_eq!(c.get(&vm.id).unwrap().state, wisp_api::VmState::Paused);
    c.resume(&vm.id).expect("resume");
    // Attached, on a raw connection: the response's head comes without any
    // console output.
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(TEN)).unwrap();
    let body = r#"{"image":"hostile","args":["spin-quiet"]}"#;
    write!(s, "POST /v1/vms?attach=true HTTP/1.1\r\nHost: wisp\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).expect("the head comes"), 1, "closed after {:?}", String::from_utf8_lossy(&head));
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(head.starts_with("HTTP/1.1 201"), "{head}");
    let id = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("x-wisp-vm-id: ").map(str::to_string));
    let id = id.expect("an id in the head");
    for id in [vm.id.as_str(), id.as_str()] {
        c.kill(id).expect("kill");
        let exit = c.wait(id).expect("wait");
        assert_ne!(exit.code, 0, "{exit:?}");
    }
    // The attached connection ends with the VM, and says how.
    let mut rest = String::new();
    s.read_to_string(&mut rest).unwrap();
    assert!(rest.ends_with("0\r\nX-Wisp-Exit: 137\r\nX-Wisp-Exit-Reason: killed\r\n\r\n"), "{rest:?}");
}
