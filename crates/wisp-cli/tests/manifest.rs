//! The image manifest (`wisp_abi::manifest`): an image declares the ABI
//! version, features and devices it needs in its note. The monitor refuses
//! at load, with one clear line and before the guest runs, what it cannot
//! give; and a guest calling a feature it did not declare gets `ENOSYS`.
//! Each test patches a copy of a real bundled image's note.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{fresh_dir, image, wisp_limit};
use wisp_abi::manifest::DEVICE_REQUIRED;

/// Offset of the wisp note's descriptor in an image file.
fn descriptor(b: &[u8]) -> usize {
    let ty = wisp_abi::NOTE_TYPE_ABI.to_le_bytes();
    let pat: Vec<u8> = ty.iter().chain(b"wisp\0\0\0\0").copied().collect();
    b.windows(pat.len()).position(|w| w == pat.as_slice()).expect("the image has a wisp note") + pat.len()
}

fn word(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// A copy of bundled image `name` with its note changed by `patch`
/// (given the file and the descriptor's offset).
fn patched(name: &str, tag: &str, patch: impl FnOnce(&mut Vec<u8>, usize)) -> PathBuf {
    let mut b = std::fs::read(image(name)).unwrap();
    let d = descriptor(&b);
    patch(&mut b, d);
    let p = fresh_dir(&format!("manifest-{tag}")).join(name);
    std::fs::write(&p, b).unwrap();
    p
}

/// `wisp run IMAGE` is refused with `needle` and the guest never ran.
fn refused(path: &PathBuf, needle: &str) {
    let r = wisp_limit(&["run", path.to_str().unwrap()], Duration::from_secs(20));
    assert_eq!(r.code, Some(125), "{}: {} {}", path.display(), r.stdout, r.stderr);
    assert!(r.stderr.starts_with("wisp: error: "), "{}", r.stderr);
    assert!(r.stderr.contains(needle), "expected '{needle}' in {}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "one line: {}", r.stderr);
    assert!(r.stdout.is_empty(), "the guest ran: {}", r.stdout);
}

#[test]
fn an_image_needing_a_feature_the_monitor_lacks_is_refused_at_load() {
    // Bit 37: no monitor of this ABI version has it.
    let p = patched("hello", "feature", |b, d| word(b, d + 12, 1 << 5));
    refused(&p, "the image needs features this monitor lacks: bit 37");
    // `inspect` still describes it, naming what it needs.
    let r = wisp_limit(&["inspect", p.to_str().unwrap()], Duration::from_secs(20));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    // (Every image of the library OS declares `stdio`.)
    assert!(r.stdout.contains("features:  stdio, bit 37"), "{}", r.stdout);
    // The unpatched image runs.
    assert_eq!(wisp_limit(&["run", "hello"], Duration::from_secs(20)).code, Some(0));
}

#[test]
fn an_image_needing_a_device_it_is_not_given_is_refused_at_load() {
    // daytime declares a required NIC: without one it does not start.
    refused(&image("daytime"), "the image needs a net device ('net0'), and none was given");
    let r = wisp_limit(&["inspect", "daytime"], Duration::from_secs(20));
    assert!(r.stdout.contains("devices:   net0 (net, required)"), "{}", r.stdout);
    // A device kind this monitor does not know, required.
    let p = patched("hello", "kind", |b, d| {
        word(b, d + 4, 1);
        word(b, d + 16, 77);
        word(b, d + 20, DEVICE_REQUIRED);
        b[d + 24..d + 28].copy_from_slice(b"gpu0");
    });
    refused(&p, "the image needs device 'gpu0' of kind 77, which this monitor does not know");
    // The same device, optional: the image runs without it.
    let p = patched("hello", "optional", |b, d| {
        word(b, d + 4, 1);
        word(b, d + 16, 77);
        b[d + 24..d + 28].copy_from_slice(b"gpu0");
    });
    let r = wisp_limit(&["run", p.to_str().unwrap(), "--", "fine"], Duration::from_secs(20));
    assert_eq!(r.code, Some(0), "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("fine"), "{}", r.stdout);
}

#[test]
fn an_image_of_another_abi_version_is_refused_at_load() {
    let p = patched("hello", "v1", |b, d| word(b, d, 1));
    refused(&p, &format!("ABI mismatch: image built for wisp ABI v1, this monitor speaks v{}", wisp_abi::ABI_VERSION));
}

#[test]
fn a_feature_the_image_did_not_declare_is_not_there_for_it() {
    // The family app declares fork and family IPC; `wisp run` allows fork.
    let r = wisp_limit(&["run", "family", "--", "cow"], Duration::from_secs(20));
    assert_eq!(r.code, Some(0), "{} {}", r.stdout, r.stderr);
    // The same image without the declaration: fork answers ENOSYS.
    let p = patched("family", "undeclared", |b, d| {
        word(b, d + 8, 0);
        word(b, d + 12, 0);
    });
    let r = wisp_limit(&["run", p.to_str().unwrap(), "--", "cow"], Duration::from_secs(20));
    assert_eq!(r.code, Some(1), "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("FAILED: ENOSYS"), "{}", r.stdout);
}
