//! A reusable VM on KVM (`vm/reuse.rs`; issue 17, recycling): the
//! `recycler` image with `hello.so` stops at its ready point, and each run
//! after goes on from there with its own arguments, scrubbed in between —
//! its ready point put back whole, or from KVM's dirty log. The recycler
//! and hello.so each exit 3 if a run finds what an earlier one left (a
//! static in RAM, a fresh heap page, a library variable).

use std::path::PathBuf;

use wisp_vmm::devices::library::LibraryDevice;
use wisp_vmm::devices::Device;
use wisp_vmm::{open_kvm, Image, Outcome, ReuseStop, Shell};

fn built(dir: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build").join(dir).join(name)
}

fn runs_scrubbed(copy_all: usize) {
    let image = Image::from_file(&built("images", "recycler")).unwrap_or_else(|e| panic!("{e} (build with `make guest`)"));
    let bytes = std::fs::read(built("libs", "hello.so")).expect("build/libs/hello.so (`make libs`)");
    let lib = LibraryDevice::from_bytes("hello", &bytes).unwrap();
    let kvm = open_kvm().unwrap();
    let devices: Vec<Box<dyn Device>> = vec![Box::new(lib)];
    let mut vm = Shell::create(&kvm, 16 << 20).unwrap().load_devices(&image, &["hello".to_string()], devices).unwrap();
    vm.set_reusable_copying(copy_all);
    let mut out = Vec::<u8>::new();
    vm.run(&mut out, None);
    assert_eq!(vm.reuse_stop(), Some(ReuseStop::Ready), "{}", String::from_utf8_lossy(&out));
    vm.keep_ready_point().unwrap();
    // Not waiting at the ready point: no arguments, no scrub.
    assert!(vm.scrub().is_err());
    for i in 0..4 {
        if i > 0 {
            let arg = format!("run{i}");
            vm.set_run_args(&["recycler", "hello", &arg]).unwrap();
        }
        let mut out = Vec::<u8>::new();
        let o = vm.run(&mut out, None);
        let text = String::from_utf8_lossy(&out).to_string();
        assert!(matches!(o, Outcome::Exited(0)) && vm.reuse_stop() == Some(ReuseStop::Ended(0)), "run {i}: {o:?} {text}");
        let want = if i == 0 { "Hello from wisp! args: []".to_string() } else { format!("Hello from wisp! args: [\"run{i}\"]") };
        assert!(text.starts_with(&want), "run {i}: {text}");
        let put = vm.scrub().unwrap();
        assert!(put > 0, "run {i}: nothing put back");
        assert_eq!(vm.reuse_stop(), None);
    }
    assert_eq!(vm.reuses(), 4);
    // Arguments that do not fit are refused, the VM still at its ready point.
    assert!(vm.set_run_args(&["recycler", "hello", &"x".repeat(8192)]).is_err());
    vm.set_run_args(&["recycler", "hello", "last"]).unwrap();
    let mut out = Vec::<u8>::new();
    assert!(matches!(vm.run(&mut out, None), Outcome::Exited(0)), "{}", String::from_utf8_lossy(&out));
}

#[test]
fn a_small_ready_point_is_put_back_whole() {
    runs_scrubbed(wisp_vmm::REUSE_COPY_ALL_PAGES);
}

#[test]
fn a_ready_point_is_put_back_from_the_dirty_log() {
    runs_scrubbed(0);
}
