//! A library's slot of the library window, mapped: host memory of its own
//! (the file's pages copy-on-write from its sealed memfd, so its code is
//! one copy in host memory for every VM that maps the file; `.bss` tails
//! zeroed; relocations written), registered as a KVM memory slot, and the
//! window's page-directory entries with each segment's permissions. A live
//! update maps the new library in another slot while the guest runs, and
//! unmaps the old one after it: so this works on the VM's descriptor from
//! any thread (a raw `KVM_SET_USER_MEMORY_REGION`, which `kvm-ioctls`
//! offers only on the `VmFd` the vCPU thread owns).

use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::NonNull;

use wisp_abi::layout::{LARGE_PAGE_SIZE, LIB_BASE, LIB_PD, LIB_SLOT, PAGE_SIZE, PDPT};

use crate::error::{Error, Result};
use crate::library::Library;
use crate::memory::RamView;

/// The first KVM memory slot of the library window (below: RAM, the
/// family's windows).
const FIRST_SLOT: u32 = 256;
/// `KVM_SET_USER_MEMORY_REGION` (`_IOW(KVMIO, 0x46, struct
/// kvm_userspace_memory_region)`).
const SET_USER_MEMORY_REGION: libc::c_ulong = 0x4020_ae46;

const P: u64 = 1;
const RW: u64 = 1 << 1;
const US: u64 = 1 << 2;
const PS: u64 = 1 << 7;
const NX: u64 = 1 << 63;

/// A library mapped in slot `slot` of the window.
pub(crate) struct Mapping {
    host: NonNull<u8>,
    size: usize,
    slot: usize,
    /// Page-directory entries it wrote (indices in the window's directory).
    pages: Vec<u64>,
}

// SAFETY: `host..host + size` is memory this mapping owns alone (never
// aliased by a Rust reference outside its own methods, which take `&self`
// to read and `&mut self` to write); moving it between threads moves that
// ownership.
unsafe impl Send for Mapping {}

/// The guest address of slot `slot`.
pub(crate) fn slot_base(slot: usize) -> u64 {
    LIB_BASE + slot as u64 * LIB_SLOT
}

/// Set KVM memory slot `FIRST_SLOT + slot` of VM `vm` to `size` bytes at
/// `host` (0 bytes: delete it).
fn set_slot(vm: RawFd, slot: usize, host: u64, size: u64) -> Result<()> {
    let region = kvm_bindings::kvm_userspace_memory_region { slot: FIRST_SLOT + slot as u32, flags: 0, guest_phys_addr: slot_base(slot), memory_size: size, userspace_addr: host };
    // SAFETY: `vm` is a KVM VM descriptor; the ioctl reads `region` (a
    // `kvm_userspace_memory_region`, as its number says); `host..host +
    // size` is a mapping that outlives the slot (deleted before unmapped).
    let r = unsafe { libc::ioctl(vm, SET_USER_MEMORY_REGION, &region) };
    if r < 0 {
        return Err(Error::Kvm("set a library's memory slot", std::io::Error::last_os_error()));
    }
    Ok(())
}

impl Mapping {
    /// Map `lib`, whose file is `file`, in slot `slot` of VM `vm` (guest
    /// RAM `ram` holds the page tables).
    pub(crate) fn new(vm: RawFd, ram: &RamView, lib: &Library, file: BorrowedFd<'_>, slot: usize) -> Result<Mapping> {
        let size = lib.span.next_multiple_of(LARGE_PAGE_SIZE) as usize;
        let host_err = |what| move |e: rustix::io::Errno| Error::Host(what, e.into());
        // SAFETY: a fresh anonymous mapping of `size` bytes, owned by the
        // `Mapping` made of it (unmapped by `unmap`, after its KVM slot).
        let host = unsafe {
            rustix::mm::mmap_anonymous(std::ptr::null_mut(), size, rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE, rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE)
        }
        .map_err(host_err("map a library's slot"))? as *mut u8;
        let mut m = Mapping { host: NonNull::new(host).expect("mmap returns no null"), size, slot, pages: Vec::new() };
        if let Err(e) = m.fill(lib, file, slot_base(slot)) {
            m.release();
            return Err(e);
        }
        if let Err(e) = set_slot(vm, slot, host as u64, size as u64) {
            m.release();
            return Err(e);
        }
        // The window's page directory: one 2 MiB entry per page a segment
        // covers, with the segment's permissions.
        let base = slot_base(slot);
        let first = (base - LIB_BASE) / LARGE_PAGE_SIZE;
        let mut r = ram.write(PDPT + (LIB_BASE >> 30) * 8, &(LIB_PD | P | RW | US).to_le_bytes());
        for s in &lib.segments {
            let (lo, hi) = (s.vaddr / LARGE_PAGE_SIZE, (s.vaddr + s.mem_size.max(1) - 1) / LARGE_PAGE_SIZE);
            for page in lo..=hi {
                let entry = (base + page * LARGE_PAGE_SIZE) | P | US | PS | if s.write { RW } else { 0 } | if s.exec { 0 } else { NX };
                r = r.and_then(|()| ram.write(LIB_PD + (first + page) * 8, &entry.to_le_bytes()));
                m.pages.push(first + page);
            }
        }
        if let Err(e) = r {
            m.unmap(vm, ram);
            return Err(e);
        }
        Ok(m)
    }

    /// The file's pages, `.bss` tails and relocations, for a library at
    /// guest address `base`.
    fn fill(&mut self, lib: &Library, file: BorrowedFd<'_>, base: u64) -> Result<()> {
        let host_err = |what| move |e: rustix::io::Errno| Error::Host(what, e.into());
        let host = self.host.as_ptr();
        for s in &lib.segments {
            if s.file_size == 0 {
                continue;
            }
            let start = s.vaddr & !(PAGE_SIZE - 1);
            let off = s.offset & !(PAGE_SIZE - 1);
            let len = (s.vaddr + s.file_size).next_multiple_of(PAGE_SIZE) - start;
            // SAFETY: `start + len` lies inside the slot's `size` bytes (the
            // library's span, checked by `Library::parse`); the file pages
            // are mapped private over this mapping's own memory.
            unsafe {
                rustix::mm::mmap(host.add(start as usize).cast(), len as usize, rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE, rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::FIXED, file, off)
            }
            .map_err(host_err("map a library's file"))?;
            // What the last file page holds past the segment (other
            // segments' bytes) is not its: zero, as its `.bss` starts.
            let (tail, page_end) = ((s.vaddr + s.file_size) as usize, (s.vaddr + s.file_size).next_multiple_of(PAGE_SIZE) as usize);
            self.bytes_mut()[tail..page_end].fill(0);
        }
        for &(off, k) in &lib.relocations {
            // `off + 8` lies in a writable segment of the library (checked
            // by `Library::parse`), inside the slot.
            self.bytes_mut()[off as usize..off as usize + 8].copy_from_slice(&(base + k).to_le_bytes());
        }
        // Every page of the writable segments made this mapping's own now
        // (copied from the file, or allocated for `.bss`): a live update
        // then writes the variables it carries over into pages that are
        // there already, while the guest waits, rather than fault each in.
        for s in lib.segments.iter().filter(|s| s.write) {
            let start = s.vaddr & !(PAGE_SIZE - 1);
            for page in (start..s.vaddr + s.mem_size).step_by(PAGE_SIZE as usize) {
                let b = &mut self.bytes_mut()[page as usize];
                // SAFETY: a byte of this mapping, written back as it is.
                unsafe { std::ptr::write_volatile(b, std::ptr::read_volatile(b)) };
            }
        }
        Ok(())
    }

    /// Register this mapping as its KVM memory slot in VM `vm` (another
    /// VM's than the one it was made for: a forked child's).
    pub(crate) fn register(&self, vm: RawFd) -> Result<()> {
        set_slot(vm, self.slot, self.host.as_ptr() as u64, self.size as u64)
    }

    /// The library's memory as the guest sees it.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `host..host + size` is this mapping's, readable.
        unsafe { std::slice::from_raw_parts(self.host.as_ptr(), self.size) }
    }

    /// The library's memory, to write (relocations, variables carried
    /// over in a live update).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `host..host + size` is this mapping's, writable; `&mut
        // self` makes this the only reference to it here.
        unsafe { std::slice::from_raw_parts_mut(self.host.as_ptr(), self.size) }
    }

    /// Take it out of the guest: its page-directory entries cleared, its
    /// KVM memory slot deleted (which drops every translation of it), its
    /// memory unmapped. A failure to delete the slot leaves the memory
    /// mapped (KVM may still read it).
    pub(crate) fn unmap(mut self, vm: RawFd, ram: &RamView) {
        for &page in &self.pages {
            let _ = ram.write(LIB_PD + page * 8, &0u64.to_le_bytes());
        }
        self.pages.clear();
        if set_slot(vm, self.slot, self.host.as_ptr() as u64, 0).is_ok() {
            self.release();
        } else {
            std::mem::forget(self);
        }
    }

    fn release(&mut self) {
        // SAFETY: this mapping's own memory, no longer in a KVM slot nor
        // referenced (the slices above borrow `self`).
        let _ = unsafe { rustix::mm::munmap(self.host.as_ptr().cast(), self.size) };
        self.size = 0;
    }
}
