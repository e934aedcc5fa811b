//! Guest RAM: one private anonymous mapping registered with KVM as the VM's
//! main memory slot.
//!
//! Private, so `fork(2)` of the monitor process gives a forked VM a
//! copy-on-write copy of guest RAM; image pages are mapped copy-on-write
//! from the image's sealed memfd on top of it. All accesses from the monitor go through
//! `vm-memory`, which bounds-checks every guest address: guest memory is
//! untrusted input and the guest may change it at any time.

use std::os::fd::BorrowedFd;

use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestRegionMmap, MmapRegion};

/// Guest RAM as vm-memory maps it: every write the monitor makes through
/// it (hypercall answers, device rings, frames and disk data) marks its
/// page in a bitmap — what KVM's dirty log cannot see, for incremental
/// snapshots.
type GuestMemoryMmap = vm_memory::GuestMemoryMmap<AtomicBitmap>;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::error::{Error, Result};

/// Guest RAM of one VM.
pub struct GuestRam {
    view: RamView,
    host_addr: u64,
    /// Ranges mapped copy-on-write from an image file: their pages may be
    /// dropped from memory while unmodified (the kernel reads them back from
    /// the file), so `mincore` may not count them; [`Self::resident`] does.
    file_ranges: std::sync::Mutex<Vec<(u64, u64)>>,
}

/// Bounds-checked access to guest RAM, cheap to clone and to hand to I/O
/// threads (the mapping stays alive while any view exists).
#[derive(Clone)]
pub struct RamView {
    mem: GuestMemoryMmap,
    size: u64,
}

impl std::ops::Deref for GuestRam {
    type Target = RamView;
    fn deref(&self) -> &RamView {
        &self.view
    }
}

impl GuestRam {
    /// Create `size` bytes of zeroed guest RAM (backed only where touched).
    pub fn new(size: u64) -> Result<GuestRam> {
        let region = MmapRegion::<AtomicBitmap>::build(
            None,
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        )
        .map_err(|e| Error::Host("mmap guest RAM", std::io::Error::other(e.to_string())))?;
        let host_addr = region.as_ptr() as u64;
        let region = GuestRegionMmap::new(region, GuestAddress(0))
            .ok_or_else(|| Error::Host("guest region", std::io::Error::other("overflow")))?;
        let mem = GuestMemoryMmap::from_regions(vec![region])
            .map_err(|e| Error::Host("guest memory", std::io::Error::other(e.to_string())))?;
        Ok(GuestRam { view: RamView { mem, size }, host_addr, file_ranges: Default::default() })
    }

    /// Add the pages the monitor wrote since the last call to `bits` (one
    /// bit a page, as KVM's dirty log: bit `i % 64` of word `i / 64`), and
    /// forget them.
    pub fn take_written(&self, bits: &mut [u64]) {
        let Some(region) = self.view.mem.find_region(GuestAddress(0)) else { return };
        let map: &AtomicBitmap = region.bitmap();
        let page = wisp_abi::layout::PAGE_SIZE as usize;
        for (i, w) in bits.iter_mut().enumerate() {
            for b in 0..64 {
                let p = i * 64 + b;
                if p * page >= self.size() as usize {
                    break;
                }
                if map.is_bit_set(p) {
                    *w |= 1 << b;
                }
            }
        }
        map.reset();
    }

    /// Host virtual address of guest-physical 0 (for KVM's memory slot).
    pub fn host_addr(&self) -> u64 {
        self.host_addr
    }

    /// A view for other threads (I/O threads of devices).
    pub fn view(&self) -> RamView {
        self.view.clone()
    }

    /// Map `len` bytes of `fd` at file offset `offset` copy-on-write at
    /// guest-physical `gpa`, replacing that part of RAM: the pages are shared
    /// with every other VM mapping the same file until one writes to them.
    /// `gpa`, `len` and `offset` must be page aligned.
    pub fn map_file_cow(&self, gpa: u64, len: u64, fd: BorrowedFd<'_>, offset: u64) -> Result<()> {
        let page = wisp_abi::layout::PAGE_SIZE;
        if !gpa.is_multiple_of(page) || !len.is_multiple_of(page) || !offset.is_multiple_of(page) || !self.contains(gpa, len) {
            return Err(Error::OutOfRange { addr: gpa, len });
        }
        self.map_cow(gpa, len, fd, offset).map_err(|e| Error::Host("mmap image copy-on-write", e.into()))?;
        self.file_ranges.lock().unwrap_or_else(|e| e.into_inner()).push((gpa, len));
        Ok(())
    }

    /// Whether `fork(2)` copies guest RAM into the child process (it does
    /// unless told otherwise). A fork that makes a spare monitor process
    /// (`vm/spare.rs`) leaves it out: the spare gets guest RAM of its own,
    /// and the parent's pages stay writable (no copy-on-write protection,
    /// no KVM mappings dropped).
    pub fn set_inherited(&self, inherited: bool) -> Result<()> {
        let advice = if inherited { rustix::mm::Advice::LinuxDoFork } else { rustix::mm::Advice::LinuxDontFork };
        // SAFETY: the range is exactly the RAM mapping this struct owns;
        // MADV_(DONT|DO)FORK change only what fork(2) does with it.
        unsafe { rustix::mm::madvise(self.host_addr as *mut std::ffi::c_void, self.size() as usize, advice) }
            .map_err(|e| Error::Host("madvise guest RAM", e.into()))
    }

    /// Replace all of guest RAM by fresh zero pages (a spare monitor
    /// process's RAM before it is handed a guest, or again after one).
    pub fn map_zero(&self) -> Result<()> {
        // SAFETY: the range is exactly the RAM mapping this struct owns (or,
        // in a spare process, the hole fork(2) left where it was), page
        // aligned; MAP_FIXED replaces it in place and nothing else. No Rust
        // reference into guest RAM exists.
        let r = unsafe {
            rustix::mm::mmap_anonymous(
                self.host_addr as *mut std::ffi::c_void,
                self.size() as usize,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::FIXED | rustix::mm::MapFlags::NORESERVE,
            )
        };
        r.map(drop).map_err(|e| Error::Host("mmap guest RAM", e.into()))
    }

    /// Map `(gpa, len, offset)` runs of file `fd` copy-on-write over guest
    /// RAM (a spare's: the pages its parent wrote into the file at the
    /// fork, packed). Runs must be page aligned and inside RAM.
    pub fn map_runs(&self, fd: BorrowedFd<'_>, runs: &[(u64, u64, u64)]) -> Result<()> {
        let page = wisp_abi::layout::PAGE_SIZE;
        for &(gpa, len, off) in runs {
            if !gpa.is_multiple_of(page) || !len.is_multiple_of(page) || !off.is_multiple_of(page) || !self.contains(gpa, len) {
                return Err(Error::OutOfRange { addr: gpa, len });
            }
            self.map_cow(gpa, len, fd, off).map_err(|e| Error::Host("mmap guest RAM from a file", e.into()))?;
        }
        Ok(())
    }

    /// Map `len` bytes of `fd` at `offset` copy-on-write over guest RAM at
    /// `gpa`; the caller checked that the range is page aligned and inside
    /// RAM.
    fn map_cow(&self, gpa: u64, len: u64, fd: BorrowedFd<'_>, offset: u64) -> rustix::io::Result<()> {
        // SAFETY: the target range lies inside the RAM mapping this struct
        // owns (checked by the callers) and is page aligned; MAP_FIXED
        // replaces those pages in place, so no other mapping is touched and
        // the RAM mapping keeps its size. No Rust reference into guest RAM is
        // held across this call (all accesses copy through vm-memory).
        let r = unsafe {
            rustix::mm::mmap(
                (self.host_addr + gpa) as *mut std::ffi::c_void,
                len as usize,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::FIXED,
                fd,
                offset,
            )
        };
        r.map(drop)
    }

    /// The pages of guest RAM that hold anything, as (guest-physical
    /// start, length) runs: pages never touched read as zeros and are left
    /// out. `None` once the runs hold more than `limit` bytes.
    /// `vec` is scratch space (kept between calls, so a fork does not
    /// fault in fresh memory for it).
    pub fn resident(&self, limit: u64, vec: &mut Vec<u8>) -> Result<Option<Vec<(u64, u64)>>> {
        let page = wisp_abi::layout::PAGE_SIZE;
        vec.resize(self.size().div_ceil(page) as usize, 0);
        // SAFETY: the range is the RAM mapping this struct owns; `vec` has
        // one byte per page of it, as mincore(2) writes.
        let r = unsafe { libc::mincore(self.host_addr as *mut libc::c_void, self.size() as usize, vec.as_mut_ptr()) };
        if r != 0 {
            return Err(Error::Host("mincore guest RAM", std::io::Error::last_os_error()));
        }
        for &(gpa, len) in self.file_ranges.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            vec[(gpa / page) as usize..((gpa + len) / page) as usize].fill(1);
        }
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut total = 0;
        for (i, _) in vec.iter().enumerate().filter(|(_, b)| **b & 1 != 0) {
            let gpa = i as u64 * page;
            total += page;
            if total > limit {
                return Ok(None);
            }
            match runs.last_mut() {
                Some((start, len)) if *start + *len == gpa => *len += page,
                _ => runs.push((gpa, page)),
            }
        }
        Ok(Some(runs))
    }

    /// Copy the guest RAM of `(gpa, len, offset)` runs to their offsets in
    /// `dst` (a mapping of a spare's RAM file), page by page, leaving pages
    /// that already hold the same bytes alone (a recycled spare's file holds
    /// the last fork's copy: most pages have not changed since).
    pub fn copy_runs(&self, dst: &crate::family::SharedMap, runs: &[(u64, u64, u64)]) -> Result<()> {
        let page = wisp_abi::layout::PAGE_SIZE as usize;
        for &(gpa, len, off) in runs {
            if off.checked_add(len).is_none_or(|end| end > dst.len() as u64) {
                return Err(Error::OutOfRange { addr: gpa, len });
            }
            let src = self.host_ptr(gpa, len as usize)?;
            for i in (0..len as usize).step_by(page) {
                // SAFETY: `src..src + len` lies in guest RAM (`host_ptr`) and
                // `off..off + len` in `dst` (checked above), so both pages
                // are inside live mappings; raw pointers only, no references
                // (guest RAM may change under a device thread).
                unsafe {
                    let (s, d) = (src.add(i), dst.as_ptr().add(off as usize + i));
                    if libc::memcmp(s.cast(), d.cast(), page) != 0 {
                        std::ptr::copy_nonoverlapping(s, d, page);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Lay `runs` (guest-physical start, length; ascending) out back to back
/// in a file: runs closer than `gap` merge (the zeros between them are
/// copied too: fewer mappings in the child). Returns `(gpa, len, offset)`
/// and the file's size.
pub fn pack_runs(runs: &[(u64, u64)], gap: u64) -> (Vec<(u64, u64, u64)>, u64) {
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for &(gpa, len) in runs {
        match merged.last_mut() {
            Some((s, l)) if gpa >= *s + *l && gpa - (*s + *l) <= gap => *l = gpa + len - *s,
            _ => merged.push((gpa, len)),
        }
    }
    let mut off = 0;
    let packed = merged
        .into_iter()
        .map(|(gpa, len)| {
            let r = (gpa, len, off);
            off += len;
            r
        })
        .collect();
    (packed, off)
}

impl RamView {
    /// Bytes of guest RAM.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// True if `[addr, addr + len)` lies entirely inside guest RAM.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr.checked_add(len).is_some_and(|end| end <= self.size)
    }

    /// Copy `data` into guest RAM at `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        if !self.contains(addr, data.len() as u64) {
            return Err(Error::OutOfRange { addr, len: data.len() as u64 });
        }
        self.mem
            .write_slice(data, GuestAddress(addr))
            .map_err(|_| Error::OutOfRange { addr, len: data.len() as u64 })
    }

    /// Copy `buf.len()` bytes out of guest RAM at `addr`.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        if !self.contains(addr, buf.len() as u64) {
            return Err(Error::OutOfRange { addr, len: buf.len() as u64 });
        }
        self.mem
            .read_slice(buf, GuestAddress(addr))
            .map_err(|_| Error::OutOfRange { addr, len: buf.len() as u64 })
    }

    /// Read a plain-data value (an ABI struct) from guest RAM.
    pub fn read_obj<T: FromBytes + IntoBytes>(&self, addr: u64) -> Result<T> {
        let mut v = T::new_zeroed();
        self.read(addr, v.as_mut_bytes())?;
        Ok(v)
    }

    /// Write a plain-data value (an ABI struct) into guest RAM.
    pub fn write_obj<T: IntoBytes + Immutable>(&self, addr: u64, v: &T) -> Result<()> {
        self.write(addr, v.as_bytes())
    }

    /// Read a little-endian u64.
    pub fn read_u64(&self, addr: u64) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Host address of the `len` bytes of guest RAM at `addr` (checked like
    /// every access), for an iovec the kernel reads or writes: a device's
    /// tap I/O moves frames between the tap and its rings without a copy.
    /// No Rust reference into guest RAM is made from it.
    pub fn host_ptr(&self, addr: u64, len: usize) -> Result<*mut u8> {
        if !self.contains(addr, len as u64) {
            return Err(Error::OutOfRange { addr, len: len as u64 });
        }
        let s = self.mem.get_slice(GuestAddress(addr), len).map_err(|_| Error::OutOfRange { addr, len: len as u64 })?;
        // The kernel may write there (a frame, a disk's data): counted as
        // written, for incremental snapshots.
        if let Some(r) = self.mem.find_region(GuestAddress(0)) {
            vm_memory::bitmap::Bitmap::mark_dirty(r.bitmap(), addr as usize, len);
        }
        Ok(s.ptr_guard_mut().as_ptr())
    }

    /// Atomically load a u32 (acquire) shared with the guest.
    pub fn load_u32(&self, addr: u64) -> Result<u32> {
        if !addr.is_multiple_of(4) || !self.contains(addr, 4) {
            return Err(Error::OutOfRange { addr, len: 4 });
        }
        self.mem
            .load::<u32>(GuestAddress(addr), std::sync::atomic::Ordering::Acquire)
            .map_err(|_| Error::OutOfRange { addr, len: 4 })
    }

    /// Atomically store a u32 (release) shared with the guest.
    pub fn store_u32(&self, addr: u64, v: u32) -> Result<()> {
        if !addr.is_multiple_of(4) || !self.contains(addr, 4) {
            return Err(Error::OutOfRange { addr, len: 4 });
        }
        self.mem
            .store(v, GuestAddress(addr), std::sync::atomic::Ordering::Release)
            .map_err(|_| Error::OutOfRange { addr, len: 4 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pages_the_monitor_writes_are_kept_for_the_next_snapshot() {
        let ram = GuestRam::new(4 << 20).unwrap();
        ram.write(0x5000, &[1; 8]).unwrap();
        ram.write(0x20_0ff8, &[2; 16]).unwrap(); // across two pages
        ram.store_u32(0x3f_f000, 7).unwrap();
        let mut buf = [0u8; 4];
        ram.read(0x7000, &mut buf).unwrap(); // a read marks nothing
        let mut bits = vec![0u64; 16];
        ram.take_written(&mut bits);
        let set: Vec<u64> = (0..1024).filter(|&p| bits[p / 64] & 1 << (p % 64) != 0).map(|p| p as u64).collect();
        assert_eq!(set, [5, 0x200, 0x201, 0x3ff]);
        // Taken: forgotten.
        let mut again = vec![0u64; 16];
        ram.take_written(&mut again);
        assert!(again.iter().all(|&w| w == 0));
    }
}
