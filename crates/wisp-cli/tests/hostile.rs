//! Hostile guests and malformed images: each ends with a clear reason or
//! error, never a hang, a crash of wisp, or a panic.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{image, wisp, wisp_limit};

/// Mode of the `hostile` test image, and what the stop reason must say.
const CASES: &[(&str, &str)] = &[
    ("write-outside-ram", "outside guest RAM"),
    ("write-null", "null pointer dereference"),
    ("write-page-tables", "protection violation"),
    ("write-boot-info", "protection violation"),
    ("write-code", "protection violation"),
    ("wild-write", "general protection fault"),
    ("exec-stack", "execute at"),
    ("hlt", "(hlt): privileged instruction"),
    ("cli", "(cli): privileged instruction"),
    ("write-cr3", "(mov to control register): privileged instruction"),
    ("ud2", "invalid opcode (#UD)"),
    ("div0", "divide error (#DE)"),
    ("int3", "breakpoint (#BP)"),
    ("port-io", "port I/O outside the hypercall window"),
    ("port-in", "the guest read a port"),
    ("doorbell-nodev", "bad port I/O on 0x607: a doorbell of no device"),
    ("port-past-doorbells", "port I/O outside the hypercall window"),
    ("stack-overflow", "stack overflow"),
    ("console-oob", "bad hypercall console_write: buffer"),
    ("console-huge-len", "exceeds the 65536-byte limit"),
    ("stdin-into-boot-info", "bad hypercall stdio: buffer 0x1000+0x40 is not in memory the guest may write"),
    ("stderr-oob", "bad hypercall stdio: buffer"),
    ("stdio-bad-op", "bad hypercall stdio: unknown operation 9"),
    ("console-wrap", "outside guest RAM"),
    ("args-oob", "argument block at 0xfffffff0"),
    ("unknown-hypercall", "unknown hypercall 12"),
    ("byte-hypercall", "1-byte out"),
    ("family-oob", "bad hypercall family: argument block at 0xfffffff0"),
    ("fork-oob", "bad hypercall fork: argument block at 0xfffffff0"),
    // Buffers in the monitor's pages of guest RAM (the guest's page tables
    // forbid them to it; the monitor must not write or read them for it).
    ("clock-into-stubs", "bad hypercall clock: argument block at 0x4000 (16 bytes) is not in memory the guest may write"),
    ("idle-into-page-tables", "bad hypercall idle: argument block at 0x6000 (16 bytes) is not in memory the guest may write"),
    ("library-into-page-tables", "bad hypercall library: argument block at 0x6000 (16 bytes) is not in memory the guest may write"),
    ("console-from-gdt", "bad hypercall console_write: buffer 0x2000+0x40 is not in memory the guest may read"),
    ("console-block-in-code", "is not in memory the guest may write"),
];

#[test]
fn ipc_data_never_lands_in_the_monitors_pages() {
    // Pipe and queue reads into the exception stubs, page tables, boot
    // info, IDT and code, and a pipe write out of the GDT, all get EFAULT;
    // then `ud2` is still reported by the monitor's intact stubs.
    let r = wisp_limit(&["run", "--timeout", "10s", "hostile", "--", "monitor-pages"], Duration::from_secs(20));
    assert!(r.stdout.contains("monitor-pages: 11 cases, 0 wrong"), "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.code, Some(139), "{}", r.stderr);
    assert!(r.stderr.contains("invalid opcode (#UD)"), "{}", r.stderr);
}

#[test]
fn bad_family_calls_fail_with_their_errno_and_the_vm_goes_on() {
    let r = wisp_limit(&["run", "--timeout", "10s", "hostile", "--", "family-abuse"], Duration::from_secs(20));
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("family-abuse: 16 cases, 0 wrong"), "{}", r.stdout);
}

#[test]
fn hostile_guests_are_stopped_with_their_reason() {
    for (mode, reason) in CASES {
        let r = wisp_limit(&["run", "--timeout", "10s", "hostile", "--", mode], Duration::from_secs(20));
        assert_eq!(r.code, Some(139), "{mode}: stdout {} stderr {}", r.stdout, r.stderr);
        assert!(r.stdout.contains(&format!("hostile: {mode}")), "{mode}: guest did not start: {}", r.stdout);
        assert!(!r.stdout.contains("survived"), "{mode}: {}", r.stdout);
        assert!(r.stderr.contains("wisp: VM stopped: "), "{mode}: {}", r.stderr);
        assert!(r.stderr.contains(reason), "{mode}: expected '{reason}' in {}", r.stderr);
    }
    // And the host still boots VMs fine.
    assert_eq!(wisp(&["run", "noop"]).code, Some(0));
}

fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wisp-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn assert_rejected(path: &PathBuf, needle: &str) {
    for cmd in ["run", "inspect"] {
        let r = wisp_limit(&[cmd, path.to_str().unwrap()], Duration::from_secs(20));
        assert_eq!(r.code, Some(125), "{cmd} {}: {} {}", path.display(), r.stdout, r.stderr);
        assert!(r.stderr.starts_with("wisp: error: "), "{}", r.stderr);
        assert!(r.stderr.contains(needle), "{cmd} {}: expected '{needle}' in {}", path.display(), r.stderr);
    }
}

/// Offset of the program headers and the index of the last PT_LOAD.
fn last_load(b: &[u8]) -> usize {
    let phoff = u64::from_le_bytes(b[32..40].try_into().unwrap()) as usize;
    let phnum = u16::from_le_bytes(b[56..58].try_into().unwrap()) as usize;
    (0..phnum).map(|i| phoff + i * 56).filter(|&p| b[p] == 1).last().unwrap()
}

#[test]
fn malformed_images_are_rejected() {
    let hello = std::fs::read(image("hello")).unwrap();

    assert_rejected(&tmp("empty", b""), "not an ELF file");
    assert_rejected(&tmp("short", &hello[..40]), "truncated ELF header");
    assert_rejected(&tmp("truncated", &hello[..hello.len() / 3]), "past the end of the file");

    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let random: Vec<u8> = (0..65536)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    assert_rejected(&tmp("random", &random), "not an ELF file");
    let mut elfish = random.clone();
    elfish[..6].copy_from_slice(b"\x7fELF\x02\x01");
    let r = wisp(&["run", tmp("elfish", &elfish).to_str().unwrap()]);
    assert_eq!(r.code, Some(125), "{}", r.stderr);

    let mut b32 = hello.clone();
    b32[4] = 1;
    assert_rejected(&tmp("elf32", &b32), "32-bit ELF");

    let mut arm = hello.clone();
    arm[18..20].copy_from_slice(&183u16.to_le_bytes());
    assert_rejected(&tmp("aarch64", &arm), "not x86-64");

    let mut huge = hello.clone();
    let p = last_load(&huge);
    huge[p + 40..p + 48].copy_from_slice(&(1u64 << 44).to_le_bytes());
    assert_rejected(&tmp("huge-segment", &huge), "beyond the largest guest RAM");

    let mut abi = hello.clone();
    let note = abi.windows(4).position(|w| w == b"wisp").unwrap();
    abi[note + 8] = 99; // descriptor follows the 8-byte aligned name
    assert_rejected(&tmp("abi99", &abi), "ABI mismatch: image built for wisp ABI v99");

    let mut nonote = hello.clone();
    nonote[note..note + 4].copy_from_slice(b"nope");
    assert_rejected(&tmp("no-note", &nonote), "no wisp ABI note");
}

#[test]
fn segments_must_fit_the_memory_asked_for() {
    let mut big = std::fs::read(image("hello")).unwrap();
    let p = last_load(&big);
    let vaddr = u64::from_le_bytes(big[p + 16..p + 24].try_into().unwrap());
    let memsz = (40u64 << 20) - vaddr; // ends at 40 MiB
    big[p + 40..p + 48].copy_from_slice(&memsz.to_le_bytes());
    let path = tmp("big-bss", &big);
    let r = wisp(&["run", "--mem", "16M", path.to_str().unwrap()]);
    assert_eq!(r.code, Some(125));
    assert!(r.stderr.contains("image does not fit"), "{}", r.stderr);
    // With enough memory it boots.
    let r = wisp(&["run", "--mem", "64M", path.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
}

#[test]
fn linux_executables_are_rejected() {
    // A static Linux executable (busybox-static) and a dynamic one.
    assert_rejected(&PathBuf::from("/bin/busybox"), "no wisp ABI note");
    assert_rejected(&PathBuf::from("/bin/true"), "dynamically linked (PT_INTERP)");
}
