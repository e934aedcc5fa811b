//! A shared library mapped into a guest (issue 17; `docs/libraries.md`):
//! a device with no region in RAM, in a slot of the library window
//! (`wisp_abi::layout::LIB_BASE`). Rooms: this file (the device: its
//! boot-info entry, its checks), `map.rs` (its slot mapped: host memory,
//! KVM memory slot, page-directory entries), `update.rs` (live update:
//! the window shared with the thread that serves the toolstack, and the
//! switch at the guest's quiescent point).
//!
//! A forked child maps its process's copy of its parent's libraries (copy
//! on write since the fork) into its own KVM VM; its libraries cannot be
//! updated. Not yet: snapshots of a VM with libraries (refused).

mod map;
pub mod update;

use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::sync::Arc;

use wisp_abi::layout::{LIB_SIZE, LIB_SLOT};
use wisp_abi::DeviceKind;

use map::{slot_base, Mapping};

use super::{Device, DeviceState};
use crate::access::UserMap;
use crate::control::Control;
use crate::error::{Error, Result};
use crate::library::restrict::{self, Loader};
use crate::library::{Library, Signed};
use crate::memory::RamView;

/// Most libraries a VM maps (the window's slots).
pub const MAX_LIBRARIES: usize = (LIB_SIZE / LIB_SLOT) as usize;

/// A library to map into a VM.
pub struct LibraryDevice {
    name: String,
    file: OwnedFd,
    lib: Library,
    /// Who signed it and as which version (verified: by `from_bytes`
    /// here, by the daemon for `from_fd`), for the image's policy.
    signed: Option<Signed>,
    /// Its slot in the window, once placed.
    slot: Option<usize>,
    /// Its memory, once mapped.
    mapping: Option<Mapping>,
}

impl LibraryDevice {
    /// Library `lib` (checked), named `name` (at most 24 bytes), whose file
    /// (ELF bytes first) is `file`.
    pub fn new(name: &str, file: OwnedFd, lib: Library) -> Result<LibraryDevice> {
        if name.is_empty() || name.len() > 24 || name.contains('\0') {
            return Err(Error::Devices(format!("library name {name:?}: 1 to 24 bytes, no NUL")));
        }
        Ok(LibraryDevice { name: name.to_string(), file, lib, signed: None, slot: None, mapping: None })
    }

    /// The library whose file is `bytes` (ELF, then its signature trailer
    /// if signed): copied into a sealed memfd (what is mapped is what was
    /// checked), its signature verified, its ELF checked.
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<LibraryDevice> {
        use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};
        let (lib, signed) = Library::read(bytes)?;
        let io = |what| move |e: rustix::io::Errno| Error::Host(what, e.into());
        let fd = memfd_create("wisp-library", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).map_err(io("memfd"))?;
        let f = std::fs::File::from(fd);
        std::io::Write::write_all(&mut &f, bytes).map_err(|e| Error::Host("copy a library", e))?;
        fcntl_add_seals(&f, SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL).map_err(io("seal a library"))?;
        Ok(LibraryDevice { signed, ..LibraryDevice::new(name, OwnedFd::from(f), lib)? })
    }

    /// The library in `fd`, a sealed memfd of its file (from the daemon,
    /// which verified its signature): its ELF read and checked again here
    /// (what is mapped is what this process parsed); its signer and
    /// version taken as the trailer says, for the image's policy.
    pub fn from_fd(name: &str, fd: OwnedFd) -> Result<LibraryDevice> {
        use rustix::fs::{fcntl_get_seals, SealFlags};
        use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};
        let io = |what| move |e: rustix::io::Errno| Error::Host(what, e.into());
        // Sealed: its bytes cannot change while they are parsed and mapped.
        let seals = fcntl_get_seals(&fd).map_err(io("a library's seals"))?;
        if !seals.contains(SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK) {
            return Err(Error::Devices(format!("library {name}: not a sealed copy")));
        }
        let len = rustix::fs::fstat(&fd).map_err(io("a library's size"))?.st_size as u64;
        if len == 0 || len > crate::library::MAX_SPAN + 4096 {
            return Err(Error::Devices(format!("library {name}: {len} bytes")));
        }
        // Parsed where it is (mapped, not read: only the pages the parse
        // looks at are touched, not a megabyte of code and data).
        // SAFETY: a read-only shared mapping of the sealed memfd's `len`
        // bytes, unmapped below; its bytes cannot change (sealed).
        let at = unsafe { mmap(std::ptr::null_mut(), len as usize, ProtFlags::READ, MapFlags::SHARED, &fd, 0) }.map_err(io("map a library"))?;
        // SAFETY: the mapping above, `len` readable bytes, alive until the
        // munmap after the parse (nothing borrowed from it outlives that).
        let (elf, signed) = crate::library::sign::split_unverified(unsafe { std::slice::from_raw_parts(at as *const u8, len as usize) });
        let lib = Library::parse(elf);
        // SAFETY: the mapping above, no longer borrowed.
        let _ = unsafe { munmap(at, len as usize) };
        Ok(LibraryDevice { signed, ..LibraryDevice::new(name, fd, lib?)? })
    }

    fn guest_base(&self) -> u64 {
        slot_base(self.slot.unwrap_or(0))
    }

    /// It goes in slot `slot` of the window (before the boot-info page is
    /// written: its entry names its address).
    pub(crate) fn place(&mut self, slot: usize) {
        self.slot = Some(slot);
    }

    /// Its memory, mapped already in this process, given to KVM VM `vm`
    /// too (a forked child's: the page tables in its RAM are the parent's).
    pub(crate) fn map_in(&self, vm: RawFd) -> Result<()> {
        match &self.mapping {
            Some(m) => m.register(vm),
            None => Ok(()),
        }
    }

    /// Its name (what the guest opens it by).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Whether the image (`manifest`, `policy`) takes it by `how`
    /// (`library::restrict`).
    pub(crate) fn allowed(&self, manifest: &wisp_abi::ImageNote, policy: Option<&wisp_abi::libpolicy::LibPolicy>, how: Loader) -> Result<()> {
        restrict::allowed(manifest, policy, &self.name, self.signed.as_ref(), how).map_err(|e| Error::Devices(format!("library {}: {e}", self.name)))
    }

    /// The bytes of its writable segments as they are now (a recycled VM's
    /// ready point, `vm/reuse.rs`): (offset in the slot, bytes) each.
    pub(crate) fn data(&self) -> Vec<(usize, Vec<u8>)> {
        let Some(m) = &self.mapping else { return Vec::new() };
        let mem = m.bytes();
        self.writable().filter_map(|(a, b)| mem.get(a..b).map(|d| (a, d.to_vec()))).collect()
    }

    /// Put back what [`LibraryDevice::data`] returned (into the same pages:
    /// the guest's translations of them stay).
    pub(crate) fn put_data(&mut self, data: &[(usize, Vec<u8>)]) {
        let Some(m) = &mut self.mapping else { return };
        let mem = m.bytes_mut();
        for (at, bytes) in data {
            if let Some(d) = mem.get_mut(*at..*at + bytes.len()) {
                d.copy_from_slice(bytes);
            }
        }
    }

    /// Its writable segments' byte ranges in the slot, page aligned.
    fn writable(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let page = wisp_abi::layout::PAGE_SIZE;
        self.lib.segments.iter().filter(|s| s.write).map(move |s| ((s.vaddr & !(page - 1)) as usize, (s.vaddr + s.mem_size).next_multiple_of(page) as usize))
    }

    /// Map it for the guest in its slot (`map.rs`) of VM `vm`.
    pub(crate) fn map(&mut self, vm: RawFd, ram: &RamView) -> Result<()> {
        let slot = self.slot.ok_or_else(|| Error::Devices("a library not placed".into()))?;
        if slot >= MAX_LIBRARIES {
            return Err(Error::Devices(format!("more than {MAX_LIBRARIES} libraries")));
        }
        self.mapping = Some(Mapping::new(vm, ram, &self.lib, self.file.as_fd(), slot)?);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::Devices;
    use wisp_abi::libpolicy::{loader, LibPolicy};
    use wisp_abi::ImageNote;

    fn hello() -> Box<dyn Device> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/libs/hello.so");
        let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e} (`make libs` builds it)", p.display()));
        Box::new(LibraryDevice::from_bytes("hello", &bytes).unwrap())
    }

    #[test]
    fn an_image_gets_the_libraries_it_names_and_its_policy_takes() {
        let check = |note: ImageNote, policy: Option<LibPolicy>| Devices::new(vec![hello()]).unwrap().check_manifest(&note, policy.as_ref()).map_err(|e| e.to_string());
        assert!(check(ImageNote::new().library("hello"), None).is_ok());
        assert_eq!(check(ImageNote::new().library("other"), None).unwrap_err(), "the image needs library 'other', and none was given (run it with --lib other.so)");
        // Named and signed with the key it trusts (the test key of `make libs`).
        let trusts = LibPolicy::new().key("ea4a6c63e29c520abef5507b132ec5f9954776aebebe7b92421eea691446d22c").min_version(1, 0, 0);
        assert!(check(ImageNote::new().library("hello"), Some(trusts.loaders(loader::NAMED))).is_ok());
        // Not named, and the image takes named ones only.
        let e = check(ImageNote::new(), Some(trusts.loaders(loader::NAMED))).unwrap_err();
        assert!(e.ends_with("the image takes only the libraries it names (none), not hello"), "{e}");
        // Another signer, a newer version.
        let other = LibPolicy::new().key(&"11".repeat(32));
        assert!(check(ImageNote::new(), Some(other)).unwrap_err().contains("which the image does not trust"));
        assert!(check(ImageNote::new(), Some(trusts.min_version(1, 1, 0))).unwrap_err().contains("version 1.0.0 is older than the 1.1.0"));
    }
}
