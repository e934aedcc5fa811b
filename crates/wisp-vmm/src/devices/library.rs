//! A shared library mapped into a guest (issue 17; `docs/libraries.md`):
//! a device with no region in RAM. Its slot in the library window
//! ([`LIB_BASE`]) is host memory of its own, registered as a KVM memory
//! slot: the library's file pages mapped copy-on-write (its code one copy
//! in host memory for every VM that maps the same file), the tails of its
//! `.bss` zeroed, its relocations (`base + k`, checked by
//! [`crate::library`]) written into its data pages. The window's page
//! directory gets one 2 MiB entry per page of a segment, with that
//! segment's permissions (read and execute, read-only, or read-write and
//! no-execute); the rest of the slot is not mapped for the guest.
//!
//! Not yet: a forked child (its KVM VM has no such memory slot: a call
//! into a library from a child faults and stops it), and snapshots of a VM
//! with libraries (refused).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use wisp_abi::layout::{LARGE_PAGE_SIZE, LIB_BASE, LIB_PD, LIB_SIZE, LIB_SLOT, PAGE_SIZE, PDPT};
use wisp_abi::DeviceKind;

use super::{Device, DeviceState};
use crate::access::UserMap;
use crate::control::Control;
use crate::error::{Error, Result};
use crate::library::Library;
use crate::memory::{GuestRam, RamView};

/// The first KVM memory slot of the library window (below: RAM, the
/// family's windows).
const FIRST_SLOT: u32 = 256;
/// Most libraries a VM maps (the window's slots).
pub const MAX_LIBRARIES: usize = (LIB_SIZE / LIB_SLOT) as usize;

const P: u64 = 1;
const RW: u64 = 1 << 1;
const US: u64 = 1 << 2;
const PS: u64 = 1 << 7;
const NX: u64 = 1 << 63;

/// A library to map into a VM.
pub struct LibraryDevice {
    name: String,
    file: OwnedFd,
    lib: Library,
    /// Its slot in the window, once placed.
    slot: Option<usize>,
}

impl LibraryDevice {
    /// Library `lib` (checked), named `name` (at most 24 bytes), whose file
    /// (ELF bytes first) is `file`.
    pub fn new(name: &str, file: OwnedFd, lib: Library) -> Result<LibraryDevice> {
        if name.is_empty() || name.len() > 24 || name.contains('\0') {
            return Err(Error::Devices(format!("library name {name:?}: 1 to 24 bytes, no NUL")));
        }
        Ok(LibraryDevice { name: name.to_string(), file, lib, slot: None })
    }

    /// The library whose file is `bytes` (ELF, then its signature trailer
    /// if signed): copied into a sealed memfd (what is mapped is what was
    /// checked), its signature verified, its ELF checked.
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<LibraryDevice> {
        use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};
        let (lib, _signed) = Library::read(bytes)?;
        let io = |what| move |e: rustix::io::Errno| Error::Host(what, e.into());
        let fd = memfd_create("wisp-library", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).map_err(io("memfd"))?;
        let f = std::fs::File::from(fd);
        std::io::Write::write_all(&mut &f, bytes).map_err(|e| Error::Host("copy a library", e))?;
        fcntl_add_seals(&f, SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL).map_err(io("seal a library"))?;
        LibraryDevice::new(name, OwnedFd::from(f), lib)
    }

    /// The library in `fd`, a sealed memfd of its file (from the daemon):
    /// read and checked again here.
    pub fn from_fd(name: &str, fd: OwnedFd) -> Result<LibraryDevice> {
        let f = std::fs::File::from(fd);
        let len = f.metadata().map_err(|e| Error::Host("a library's size", e))?.len();
        if len > crate::library::MAX_SPAN + 4096 {
            return Err(Error::Devices(format!("library {name}: {len} bytes")));
        }
        let mut bytes = vec![0u8; len as usize];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut bytes, 0).map_err(|e| Error::Host("read a library", e))?;
        let (lib, _signed) = Library::read(&bytes)?;
        LibraryDevice::new(name, OwnedFd::from(f), lib)
    }

    fn guest_base(&self) -> u64 {
        LIB_BASE + self.slot.unwrap_or(0) as u64 * LIB_SLOT
    }

    /// It goes in slot `slot` of the window (before the boot-info page is
    /// written: its entry names its address).
    pub(crate) fn place(&mut self, slot: usize) {
        self.slot = Some(slot);
    }

    /// Map it for the guest in its slot: host memory, its KVM memory slot,
    /// its page-directory entries.
    pub(crate) fn map(&mut self, vm: &kvm_ioctls::VmFd, ram: &GuestRam) -> Result<()> {
        let slot = self.slot.ok_or_else(|| Error::Devices("a library not placed".into()))?;
        if slot >= MAX_LIBRARIES {
            return Err(Error::Devices(format!("more than {MAX_LIBRARIES} libraries")));
        }
        let size = self.lib.span.next_multiple_of(LARGE_PAGE_SIZE) as usize;
        let host_err = |what| move |e: rustix::io::Errno| Error::Host(what, e.into());
        // SAFETY: a fresh anonymous mapping of `size` bytes, owned by this
        // device (never unmapped: KVM reads it for the VM's life).
        let host = unsafe {
            rustix::mm::mmap_anonymous(std::ptr::null_mut(), size, rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE, rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE)
        }
        .map_err(host_err("map a library's slot"))? as *mut u8;
        for s in &self.lib.segments {
            if s.file_size == 0 {
                continue;
            }
            let start = s.vaddr & !(PAGE_SIZE - 1);
            let off = s.offset & !(PAGE_SIZE - 1);
            let len = (s.vaddr + s.file_size).next_multiple_of(PAGE_SIZE) - start;
            // SAFETY: `start + len` lies inside the slot's `size` bytes (the
            // library's span, checked by `Library::parse`); the file pages
            // are mapped private over this device's own mapping.
            unsafe {
                rustix::mm::mmap(host.add(start as usize).cast(), len as usize, rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE, rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::FIXED, self.file.as_fd(), off)
            }
            .map_err(host_err("map a library's file"))?;
            // What the last file page holds past the segment (other
            // segments' bytes) is not its: zero, as its `.bss` starts.
            let (tail, page_end) = ((s.vaddr + s.file_size) as usize, (s.vaddr + s.file_size).next_multiple_of(PAGE_SIZE) as usize);
            // SAFETY: inside the slot; private pages of this device.
            unsafe { std::ptr::write_bytes(host.add(tail), 0, page_end - tail) };
        }
        let base = self.guest_base();
        for &(off, k) in &self.lib.relocations {
            // SAFETY: `off + 8` lies in a writable segment of the library
            // (checked by `Library::parse`), inside the slot.
            unsafe { host.add(off as usize).cast::<u64>().write_unaligned(base + k) };
        }
        let region = kvm_bindings::kvm_userspace_memory_region { slot: FIRST_SLOT + slot as u32, flags: 0, guest_phys_addr: base, memory_size: size as u64, userspace_addr: host as u64 };
        // SAFETY: `host..host + size` is this device's mapping, never
        // unmapped while the process lives.
        unsafe { vm.set_user_memory_region(region) }.map_err(|e| Error::Kvm("set a library's memory slot", e.into()))?;
        // The window's page directory: one 2 MiB entry per page a segment
        // covers, with the segment's permissions.
        ram.write(PDPT + (LIB_BASE >> 30) * 8, &(LIB_PD | P | RW | US).to_le_bytes())?;
        let first = (base - LIB_BASE) / LARGE_PAGE_SIZE;
        for s in &self.lib.segments {
            let (lo, hi) = (s.vaddr / LARGE_PAGE_SIZE, (s.vaddr + s.mem_size.max(1) - 1) / LARGE_PAGE_SIZE);
            for page in lo..=hi {
                let entry = (base + page * LARGE_PAGE_SIZE) | P | US | PS | if s.write { RW } else { 0 } | if s.exec { 0 } else { NX };
                ram.write(LIB_PD + (first + page) * 8, &entry.to_le_bytes())?;
            }
        }
        Ok(())
    }
}

impl Device for LibraryDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Library
    }

    fn region_size(&self) -> u64 {
        0
    }

    fn params(&self) -> [u64; 5] {
        let mut name = [0u8; 24];
        name[..self.name.len()].copy_from_slice(self.name.as_bytes());
        let w = |i: usize| u64::from_le_bytes(name[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        [w(0), w(1), w(2), self.guest_base(), self.lib.span]
    }

    fn activate(&mut self, _ram: RamView, _base: u64, _control: Arc<Control>, _user: &UserMap) -> std::io::Result<()> {
        // Mapped already (`map`, with the KVM VM): nothing runs.
        Ok(())
    }

    fn notify(&self) {}

    fn on_fork_child(&mut self) {}

    fn restore_state(&mut self, _state: &DeviceState) -> Result<()> {
        Err(Error::Devices("snapshots of VMs with libraries are not supported yet".into()))
    }

    fn quiesced(&self, _f: &mut dyn FnMut()) -> Result<()> {
        Err(Error::Devices("snapshots of VMs with libraries are not supported yet".into()))
    }

    fn as_library(&mut self) -> Option<&mut LibraryDevice> {
        Some(self)
    }
}
