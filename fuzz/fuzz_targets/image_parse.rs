//! The image/ELF loader: `Image::parse` over arbitrary bytes must never panic, and an image it
//! accepts must keep the promises the loader relies on.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use wisp_abi::layout::{IMAGE_BASE, MAX_MEM};
use wisp_vmm::image::PF_X;
use wisp_vmm::Image;

fuzz_target!(|data: &[u8]| {
    let bytes: Arc<[u8]> = data.into();
    let Ok(img) = Image::parse("fuzz", bytes) else { return };
    assert!(!img.segments.is_empty());
    for s in &img.segments {
        assert!(s.filesz <= s.memsz);
        assert!(s.vaddr >= IMAGE_BASE);
        assert!(s.end() <= MAX_MEM);
        // The bytes a segment loads are inside the file.
        assert_eq!(img.file_bytes(s).len() as u64, s.filesz);
        let _ = s.perms();
    }
    for w in img.segments.windows(2) {
        assert!(w[0].vaddr <= w[1].vaddr, "segments not sorted");
        assert!(w[0].end() <= w[1].vaddr, "segments overlap");
    }
    assert!(img.segments.iter().any(|s| s.flags & PF_X != 0 && img.entry >= s.vaddr && img.entry < s.end()));
    assert!(img.start() <= img.end());
    assert!(img.end() <= MAX_MEM);
    assert_eq!(img.abi_version, wisp_abi::ABI_VERSION);
    for d in img.manifest.devices() {
        let _ = (d.name(), d.required(), wisp_abi::DeviceKind::from_u32(d.kind));
    }
    let _ = wisp_abi::features::Names(img.manifest.feature_bits()).to_string();
});
