//! A pooled shell that already holds the image a request will most likely
//! ask for: loaded, mapped, its page tables written and live, and its
//! pages touched once by a few instructions of the monitor's
//! ([`arch::PREFAULT_CODE`]) in a first run with the image's own page
//! tables, its entry registers set, its family region and control block
//! made. A start of that image then only writes the boot-info page: no
//! parsing, no mappings, no page-table reload, no call into KVM, and the
//! guest's first accesses find their pages (host and KVM page tables)
//! in place.
//!
//! A start of another image cannot reuse those page tables (KVM may keep
//! translations of them that a rewrite from the host would not reach): the
//! shell's RAM is cleared and it gets a new KVM VM ([`Shell::forget_preload`]),
//! which costs about what preparing a shell does.

use wisp_abi::layout::{BOOT_INFO, IMAGE_BASE, MIN_HEAP, PAGE_SIZE, STACK_TOP};

use crate::arch;
use crate::error::{Error, Result};
use crate::family::{Family, FamilyOptions};
use crate::image::{Image, PF_W};
use crate::loader;
use crate::shell::{load_sregs, Preloaded, Shell};
use crate::state;

/// Writable pages of a segment touched ahead (more are touched by the
/// guest itself: a large zeroed area is not made resident in every shell).
const WRITE_AHEAD: u64 = 32;
/// Stack pages touched ahead (from the top).
const STACK_AHEAD: u64 = 8;
/// Heap pages touched ahead (from the image's end).
const HEAP_AHEAD: u64 = 8;

impl Shell {
    /// Load `image` into this (prepared) shell ahead of a request, and touch
    /// its pages. The start that then names the same image
    /// ([`Shell::preloaded`]) skips all of it.
    pub fn preload(&mut self, image: Image) -> Result<()> {
        self.forget_preload()?;
        loader::check_features(&image)?;
        if image.end() + MIN_HEAP > self.ram.size() {
            return Err(Error::BadMemory(format!(
                "memory too small: the image needs at least {} KiB of RAM (--mem), {} MiB given",
                (image.end() + MIN_HEAP) >> 10,
                self.ram.size() >> 20
            )));
        }
        for s in &image.segments {
            loader::load_segment(&self.ram, &image, s)?;
        }
        let user = arch::map_image(&self.ram, &image)?;
        // The boot-info page is written from here at the start: its host
        // page made now, before the guest's view of it is (a first write
        // later would replace the shared zero page, and the view with it).
        self.ram.write_obj(BOOT_INFO, &wisp_abi::BootInfo::new())?;
        load_sregs(&self.vcpu)?;
        let regs = arch::prefault(&self.ram, &pages(&image, self.ram.size()))?;
        self.vcpu.set_regs(&regs).map_err(|e| Error::Kvm("set registers", e.into()))?;
        self.run_to_warmup_port("prefault run")?;
        // The entry registers too: a start writes only the boot-info page
        // (and takes the guest's clock base from the host's TSC).
        self.vcpu.set_regs(&arch::initial_regs(image.entry)).map_err(|e| Error::Kvm("set registers", e.into()))?;
        let tsc_offset = state::stable_tsc().then(|| state::tsc_offset(&self.vcpu)).transpose()?;
        self.warmed = true;
        self.preloaded = Some(Preloaded { image, user, tsc_offset });
        // The family region too (its pages touched by making it).
        if self.family.is_none() {
            let f = Family::new_root(FamilyOptions::default()).map_err(|e| Error::Host("family region", e))?;
            let control = std::sync::Arc::new(crate::control::Control::new(f.bell_ref()));
            self.family = Some((f, control));
        }
        Ok(())
    }

    /// The image this shell holds, if any.
    pub fn preloaded(&self) -> Option<&Image> {
        self.preloaded.as_ref().map(|p| &p.image)
    }

    /// Drop the preloaded image: RAM cleared, a new KVM VM over it, the
    /// machine state written again and entered once (as prepared).
    pub fn forget_preload(&mut self) -> Result<()> {
        match self.preloaded.take() {
            Some(_) => self.clear_preloaded(),
            None => Ok(()),
        }
    }

    /// What [`Shell::forget_preload`] does once the image is taken out.
    pub(crate) fn clear_preloaded(&mut self) -> Result<()> {
        self.ram.map_zero()?;
        self.renew_warm()
    }
}

/// The pages a starting guest touches first, as `(address, write)`: its
/// image (read-only segments read, writable ones written back unchanged,
/// at most [`WRITE_AHEAD`] pages each), the top of its stack, the start of
/// its heap and the boot-info page.
fn pages(image: &Image, ram: u64) -> Vec<(u64, bool)> {
    let mut v = vec![(BOOT_INFO, false)];
    for s in &image.segments {
        let (first, end) = (s.vaddr & !(PAGE_SIZE - 1), s.vaddr + s.memsz);
        let write = s.flags & PF_W != 0;
        let mut a = first.max(IMAGE_BASE);
        while a < end && (!write || a < first + WRITE_AHEAD * PAGE_SIZE) {
            v.push((a, write));
            a += PAGE_SIZE;
        }
    }
    v.extend((1..=STACK_AHEAD).map(|i| (STACK_TOP - i * PAGE_SIZE, true)));
    let heap = image.end();
    v.extend((0..HEAP_AHEAD).map(|i| heap + i * PAGE_SIZE).filter(|&a| a + PAGE_SIZE <= ram).map(|a| (a, true)));
    v.truncate(arch::PREFAULT_MAX);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::{Segment, PF_R, PF_X};

    #[test]
    fn the_pages_touched_ahead_are_bounded_and_writes_only_where_writable() {
        let seg = |vaddr, memsz, flags| Segment { vaddr, memsz, filesz: 0, offset: 0, flags };
        let image = Image {
            name: "t".into(),
            bytes: std::sync::Arc::from(Vec::new()),
            entry: IMAGE_BASE,
            segments: vec![seg(IMAGE_BASE, 3 * PAGE_SIZE, PF_R | PF_X), seg(IMAGE_BASE + 0x3000, 1 << 20, PF_R | PF_W)],
            abi_version: wisp_abi::ABI_VERSION,
            manifest: wisp_abi::manifest::ImageNote::new(),
            lib_policy: None,
            file: None,
            relocated: None,
        };
        let p = pages(&image, 16 << 20);
        assert!(p.len() <= arch::PREFAULT_MAX);
        assert!(p.contains(&(BOOT_INFO, false)));
        assert_eq!(p.iter().filter(|(a, _)| (IMAGE_BASE..IMAGE_BASE + 0x3000).contains(a)).count(), 3);
        assert!(p.iter().filter(|(a, _)| *a < IMAGE_BASE + 0x3000 && *a >= IMAGE_BASE).all(|(_, w)| !w));
        let data = p.iter().filter(|(a, _)| (IMAGE_BASE + 0x3000..image.end()).contains(a)).count() as u64;
        assert_eq!(data, WRITE_AHEAD, "a large writable segment is touched only at its start");
        assert!(p.contains(&(STACK_TOP - PAGE_SIZE, true)) && p.contains(&(image.end(), true)));
    }
}
