//! One monitor process runs many misbehaving guests one after another and
//! stays healthy: guest behaviour never panics the monitor library.

use std::path::PathBuf;
use std::time::Duration;

use wisp_vmm::{open_kvm, Image, Outcome, Shell, StopReason};

fn image(name: &str) -> Image {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/images").join(name);
    Image::from_file(&p).unwrap_or_else(|e| panic!("{e} (build guest images with `make guest`)"))
}

fn run(img: &Image, args: &[&str], timeout: Duration) -> (Outcome, Vec<u8>) {
    let kvm = open_kvm().expect("/dev/kvm");
    let shell = Shell::create(&kvm, 16 << 20).expect("shell");
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let mut vm = shell.load(img, &args).expect("load");
    let mut console = Vec::new();
    let outcome = vm.run(&mut console, Some(timeout));
    (outcome, console)
}

#[test]
fn many_hostile_guests_in_one_process() {
    let hostile = image("hostile");
    let hello = image("hello");
    let modes = ["spin", "hlt", "ud2", "stack-overflow", "write-outside-ram", "console-oob", "args-oob", "unknown-hypercall"];
    for round in 0..3 {
        for mode in modes {
            let (outcome, console) = run(&hostile, &[mode], Duration::from_millis(200));
            let Outcome::Stopped(reason) = outcome else {
                panic!("round {round} {mode}: not stopped: {outcome:?}");
            };
            if mode == "spin" {
                assert_eq!(reason, StopReason::Timeout);
            } else {
                assert_ne!(reason, StopReason::Timeout, "{mode}");
            }
            assert!(String::from_utf8_lossy(&console).contains(mode));
        }
        let (outcome, console) = run(&hello, &["still", "fine"], Duration::from_secs(5));
        assert_eq!(outcome, Outcome::Exited(0));
        assert!(String::from_utf8_lossy(&console).contains("[\"still\", \"fine\"]"));
    }
}

#[test]
fn stats_count_phases_and_exits() {
    let kvm = open_kvm().unwrap();
    let mut vm = Shell::create(&kvm, 16 << 20).unwrap().load(&image("noop"), &[]).unwrap();
    let mut console = Vec::new();
    assert_eq!(vm.run(&mut console, None), Outcome::Exited(0));
    let s = vm.stats();
    assert_eq!(s.exits, 1, "noop boots and exits with exactly one exit");
    for phase in ["kvm_create", "memory", "arch_setup", "image_load", "guest_init"] {
        assert!(s.get(phase).is_some(), "missing phase {phase}");
    }
}

#[test]
fn fork_is_refused_unless_the_monitor_enables_it() {
    // A monitor library user that did not opt in (wispd, for now) answers
    // the fork hypercall with ENOSYS; the guest goes on.
    let (outcome, console) = run(&image("family"), &["cow"], Duration::from_secs(10));
    assert_eq!(outcome, Outcome::Exited(1));
    assert!(String::from_utf8_lossy(&console).contains("FAILED: ENOSYS"), "{}", String::from_utf8_lossy(&console));
}
