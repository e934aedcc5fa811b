//! Boot-info argument encoding: `BootInfo::set_args` then `args` gives the arguments back exactly,
//! or `set_args` says how many bytes they need (or `usize::MAX` for a NUL) and leaves the counts
//! the guest reads as they were. And `args` over any boot-info page (whatever a guest left in it) never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wisp_abi::bootinfo::ARGS_MAX;
use wisp_abi::{BootInfo, DeviceKind};
use zerocopy::{FromZeros, IntoBytes};

fuzz_target!(|data: &[u8]| {
    // 1. Round trip: arguments separated by 0xff (never in UTF-8).
    let args: Vec<String> = data.split(|&b| b == 0xff).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let mut bi = BootInfo::new();
    bi.set_args(["previous", "args"]).unwrap();
    match bi.set_args(args.iter().map(String::as_str)) {
        Ok(()) => {
            let back: Vec<&[u8]> = bi.args().collect();
            let want: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            assert_eq!(back, want);
            assert_eq!(bi.argc as usize, args.len());
            let len: usize = args.iter().map(|a| a.len() + 1).sum();
            assert_eq!(bi.args_len as usize, len);
            assert!(len <= ARGS_MAX);
        }
        Err(n) => {
            if args.iter().any(|a| a.contains('\0')) {
                assert_eq!(n, usize::MAX);
            } else {
                let len: usize = args.iter().map(|a| a.len() + 1).sum();
                assert_eq!(n, len);
                assert!(len > ARGS_MAX);
            }
            // The counts the guest reads are unchanged. The bytes are not: `set_args` copies the
            // arguments that fit before it meets a NUL (or runs out of room) and does not undo that,
            // so after a refusal `args()` can mix new bytes with the old counts
            // (artifacts/boot_args/crash-29afbbce…). Harmless today (the one caller gives up on
            // error), so not asserted here; reported instead.
            assert_eq!(bi.argc, 2);
            assert_eq!(bi.args_len, 14);
        }
    }

    // 2. Any page: the input's bytes as the boot-info page.
    let mut page = BootInfo::new_zeroed();
    let raw = page.as_mut_bytes();
    let n = raw.len().min(data.len());
    raw[..n].copy_from_slice(&data[..n]);
    let mut total = 0usize;
    for a in page.args() {
        total += a.len();
        assert!(!a.contains(&0));
    }
    assert!(total <= ARGS_MAX);
    for d in page.devices.iter().take(page.device_count as usize) {
        if let Some(k) = DeviceKind::from_u32(d.kind) {
            assert_eq!(DeviceKind::from_u32(k as u32), Some(k));
            let _ = k.name();
        }
    }
});
