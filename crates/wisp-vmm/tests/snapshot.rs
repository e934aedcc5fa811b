//! Snapshots of real VMs on KVM: a counting guest saved part way (running,
//! idle, or paused) goes on from its count when restored, with its memory
//! whole, as many times as it is restored; a snapshot for another RAM size,
//! an altered one, or one whose page tables are not the monitor's, is
//! refused.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wisp_vmm::snapshot::{self, Snapshot};
use wisp_vmm::{open_kvm, Console, Image, Outcome, Shell};

fn image(name: &str) -> Image {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/images").join(name);
    Image::from_file(&p).unwrap_or_else(|e| panic!("{e} (build guest images with `make guest`)"))
}

/// A console other threads can read while the VM runs.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Console for Shared {
    fn write_err(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.write(b).map(drop)
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Wait (at most 10 s) until the output holds `what`.
    fn wait_for(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.text().contains(what) {
            assert!(Instant::now() < deadline, "no {what:?} in {:?}", self.text());
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The sum the counter prints after `ticks` ticks.
fn sum_after(ticks: u64) -> u64 {
    (0..ticks * 512).fold(0u64, |a, i| a.wrapping_add(i.wrapping_mul(i)))
}

fn temp(tag: &str) -> (PathBuf, File) {
    let p = std::env::temp_dir().join(format!("wisp-snapshot-{tag}-{}", std::process::id()));
    let f = File::options().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
    (p, f)
}

/// Start `counter TICKS INTERVAL` in a thread: its control, console, and
/// the thread (which returns the outcome).
fn start(ticks: u64, interval: &str) -> (Arc<wisp_vmm::Control>, Shared, std::thread::JoinHandle<Outcome>) {
    let kvm = open_kvm().expect("/dev/kvm");
    let mut vm = Shell::create(&kvm, 16 << 20).unwrap().load(&image("counter"), &[ticks.to_string(), interval.into()]).unwrap();
    let control = vm.control();
    let console = Shared::default();
    let mut c = console.clone();
    let t = std::thread::spawn(move || vm.run(&mut c, Some(Duration::from_secs(60))));
    (control, console, t)
}

/// Save the VM behind `control` into a new sealed file.
fn save(control: &wisp_vmm::Control, tag: &str) -> (PathBuf, File, wisp_vmm::Saved) {
    let (p, f) = temp(tag);
    let saved = control.save(Box::new(f.try_clone().unwrap()), Duration::from_secs(5)).expect("saved");
    snapshot::seal(&f).unwrap();
    (p, f, saved)
}

/// Restore `f` into a new 16 MiB shell and run it to its end.
fn restore_and_run(f: &File) -> (Outcome, String) {
    let snap = Snapshot::read(f, true).expect("a good snapshot");
    let kvm = open_kvm().unwrap();
    let mut sh = Shell::create(&kvm, 16 << 20).unwrap();
    // A pooled shell's state: entered once.
    sh.warm_up().unwrap();
    let mut vm = sh.restore(&snap, f.as_fd(), Vec::new()).expect("restored");
    let mut console = Vec::new();
    let outcome = vm.run(&mut console, Some(Duration::from_secs(60)));
    (outcome, String::from_utf8_lossy(&console).into_owned())
}

/// The first count a restored run printed.
fn first_count(out: &str) -> u64 {
    out.lines().find_map(|l| l.strip_prefix("count ")).and_then(|l| l.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no count in {out:?}"))
}

#[test]
fn a_restored_vm_goes_on_from_its_count_with_its_memory() {
    let (control, console, t) = start(40, "10ms");
    console.wait_for("count 10 ");
    let (p, f, saved) = save(&control, "running");
    // The original goes on to its end.
    assert_eq!(t.join().unwrap(), Outcome::Exited(0));
    assert!(console.text().contains(&format!("counter: done, sum {}", sum_after(40))));
    // It held ~40 KiB of heap and more: the snapshot is its touched pages,
    // not its 16 MiB.
    assert!(saved.ram_bytes > 40 << 10 && saved.ram_bytes < 2 << 20, "{saved:?}");
    // Restored twice, at once: both go on from the count they were saved
    // at, and end with the sum of all 40 ticks (their memory is whole).
    let runs: Vec<_> = (0..2).map(|_| {
        let f = f.try_clone().unwrap();
        std::thread::spawn(move || restore_and_run(&f))
    }).collect();
    for r in runs {
        let (outcome, out) = r.join().unwrap();
        assert_eq!(outcome, Outcome::Exited(0), "{out}");
        let k = first_count(&out);
        assert!((10..40).contains(&k), "restored at count {k}: {out}");
        assert!(!out.contains("count 1 "), "started over: {out}");
        assert!(out.contains(&format!("count {k} sum {}", sum_after(k))), "{out}");
        assert!(out.ends_with(&format!("counter: done, sum {}\n", sum_after(40))), "{out}");
    }
    let _ = std::fs::remove_file(p);
}

#[test]
fn an_idle_or_paused_vm_is_saved_too() {
    // Ticks a second apart: the VM is parked in the idle hypercall.
    let (control, console, t) = start(3, "1s");
    console.wait_for("count 1 ");
    let start = Instant::now();
    let (p1, f1, _) = save(&control, "idle");
    assert!(start.elapsed() < Duration::from_millis(500), "an idle VM waited for its tick: {:?}", start.elapsed());
    // Paused: saved as it is, and still paused afterwards.
    assert!(control.pause(Duration::from_secs(1)));
    let (p2, f2, _) = save(&control, "paused");
    assert!(control.is_paused());
    control.resume();
    control.kill();
    t.join().unwrap();
    for f in [&f1, &f2] {
        let (outcome, out) = restore_and_run(f);
        assert_eq!(outcome, Outcome::Exited(0), "{out}");
        assert!(out.starts_with("count 2 "), "{out}");
    }
    for p in [p1, p2] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn a_snapshot_that_does_not_fit_is_refused() {
    let (control, console, t) = start(1000, "10ms");
    console.wait_for("count 3 ");
    let (p, f, _) = save(&control, "refused");
    control.kill();
    t.join().unwrap();
    let kvm = open_kvm().unwrap();
    let snap = Snapshot::read(&f, true).unwrap();
    // Another RAM size.
    let e = Shell::create(&kvm, 32 << 20).unwrap().restore(&snap, f.as_fd(), Vec::new()).err().expect("refused");
    assert_eq!(e.to_string(), "snapshot for 16 MiB of guest RAM, 32 MiB here");
    // A page altered: the digest says so.
    let mut b = [0u8; 1];
    let last = f.metadata().unwrap().len() - 1;
    f.read_exact_at(&mut b, last).unwrap();
    f.write_all_at(&[b[0] ^ 0x80], last).unwrap();
    assert_eq!(Snapshot::read(&f, true).unwrap_err(), snapshot::Error::Digest);
    // Page tables giving the guest its own page tables (sealed again: a
    // snapshot that is whole, but not one the monitor wrote).
    f.write_all_at(&[b[0]], last).unwrap();
    let mut hostile = snap.clone();
    assert_eq!(hostile.pt0[0xc] & 0x000f_ffff_ffff_f000, 0xc000, "PT0's own entry");
    hostile.pt0[0xc] |= 4; // user-accessible
    f.write_all_at(&hostile.encode_head(), 0).unwrap();
    snapshot::seal(&f).unwrap();
    let snap = Snapshot::read(&f, true).unwrap();
    let e = Shell::create(&kvm, 16 << 20).unwrap().restore(&snap, f.as_fd(), Vec::new()).err().expect("refused");
    assert!(e.to_string().contains("page table entry for 0xc000"), "{e}");
    let _ = std::fs::remove_file(p);
}

/// Save the VM behind `control` (only the pages written since its last
/// snapshot with `incremental`, over `base`) through a pipe, received and
/// sealed as the daemon does.
fn save_through_pipe(control: &wisp_vmm::Control, tag: &str, incremental: bool, base: Option<[u8; 32]>) -> (PathBuf, File, Result<Snapshot, String>) {
    let (p, f) = temp(tag);
    let (mut rd, wr) = std::io::pipe().unwrap();
    let file = f.try_clone().unwrap();
    let reader = std::thread::spawn(move || snapshot::receive_over(&mut rd, &file, 1 << 30, base));
    let saved = control.save_with(Box::new(wr), incremental, Duration::from_secs(5));
    let received = reader.join().unwrap();
    let r = saved.and_then(|_| received.map_err(|e| e.to_string()));
    (p, f, r)
}

#[test]
fn incremental_snapshots_restore_over_their_base() {
    let (control, console, t) = start(60, "10ms");
    console.wait_for("count 3 ");
    // None yet to build on.
    let (p0, _, r) = save_through_pipe(&control, "inc0", true, None);
    assert!(r.unwrap_err().contains("needs an earlier snapshot"));
    let (pa, fa, a) = save_through_pipe(&control, "base", false, None);
    let a = a.unwrap();
    console.wait_for("count 20 ");
    // Paused: the increment, then a full snapshot of the same moment.
    assert!(control.pause(Duration::from_secs(1)));
    let (pb, fb, b) = save_through_pipe(&control, "inc", true, Some(a.header.digest));
    let b = b.unwrap();
    let (pc, fc, c) = save_through_pipe(&control, "full", false, None);
    let c = c.unwrap();
    control.resume();
    control.kill();
    t.join().unwrap();
    // Only what was written since the base: less than the whole.
    let ram = |s: &Snapshot| s.runs.iter().map(|r| r.len).sum::<u64>();
    assert!(ram(&b) > 0 && ram(&b) < ram(&c), "increment {} B, whole {} B", ram(&b), ram(&c));
    assert_eq!(b.header.base_digest, a.header.digest);
    let kvm = open_kvm().unwrap();
    let (a, b) = (Snapshot::read(&fa, true).unwrap(), Snapshot::read(&fb, true).unwrap());
    // Restored over its base: on from count 20, memory whole.
    let mut vm = Shell::create(&kvm, 16 << 20).unwrap().restore_chain(&[(&a, fa.as_fd()), (&b, fb.as_fd())], Vec::new()).expect("restored");
    let mut out = Vec::new();
    assert_eq!(vm.run(&mut out, Some(Duration::from_secs(30))), Outcome::Exited(0));
    let out = String::from_utf8_lossy(&out).into_owned();
    let k = first_count(&out);
    assert!(k >= 20, "restored at {k}: {out}");
    assert!(out.contains(&format!("count {k} sum {}", sum_after(k))) && out.ends_with(&format!("counter: done, sum {}\n", sum_after(60))), "{out}");
    // Held (a migration's destination): the base restored first, the
    // increment laid over it later; the same VM.
    let mut held = Shell::create(&kvm, 16 << 20).unwrap().begin_restore(&[(&a, fa.as_fd())], Vec::new()).expect("base restored");
    held.over(&b, fb.as_fd()).expect("increment laid over");
    let mut out = Vec::new();
    assert_eq!(held.finish().expect("a VM").run(&mut out, Some(Duration::from_secs(30))), Outcome::Exited(0));
    let out = String::from_utf8_lossy(&out).into_owned();
    let k = first_count(&out);
    assert!(k >= 20 && out.ends_with(&format!("counter: done, sum {}\n", sum_after(60))), "held restore at {k}: {out}");
    // Laid over what it was not made over, or a full snapshot laid over: refused.
    let c = Snapshot::read(&fc, true).unwrap();
    let mut other = Shell::create(&kvm, 16 << 20).unwrap().begin_restore(&[(&c, fc.as_fd())], Vec::new()).expect("restored");
    let e = other.over(&b, fb.as_fd()).err().unwrap().to_string();
    assert!(e.contains("not made over"), "{e}");
    let e = other.over(&c, fc.as_fd()).err().unwrap().to_string();
    assert!(e.contains("a full one"), "{e}");
    // Alone, or over another base, it is refused.
    let e = Shell::create(&kvm, 16 << 20).unwrap().restore(&b, fb.as_fd(), Vec::new()).err().unwrap().to_string();
    assert!(e.contains("needs its base"), "{e}");
    let e = Shell::create(&kvm, 16 << 20).unwrap().restore_chain(&[(&b, fb.as_fd()), (&b, fb.as_fd())], Vec::new()).err().unwrap().to_string();
    assert!(e.contains("needs its base"), "{e}");
    let e = Shell::create(&kvm, 16 << 20).unwrap().restore_chain(&[(&a, fa.as_fd()), (&a, fa.as_fd())], Vec::new()).err().unwrap().to_string();
    assert!(e.contains("a full one"), "{e}");
    for p in [p0, pa, pb, pc] {
        let _ = std::fs::remove_file(p);
    }
}
