//! Disks (`wisp run --volume FILE[:ro]`): whole 4 KiB sectors read and
//! written through the request and completion rings of `wisp_abi::blk`.
//! A call queues its requests (up to 1 MiB each, up to 128 at once), kicks
//! the disk only if the monitor sleeps, and waits for their completions —
//! looking for 100 µs, then parked in the idle hypercall (no CPU).
//!
//! ```ignore
//! let disk = wisp::blk::disk().expect("run with --volume");
//! let mut sector = alloc::vec![0u8; 4096];
//! disk.read(0, &mut sector)?;
//! if !disk.read_only() {
//!     disk.write(4096, &sector)?;
//!     disk.flush()?;
//! }
//! ```

use core::fmt;
use core::sync::atomic::{AtomicU32, Ordering};

use wisp_abi::blk::{self, hdr, BlkComp, BlkReq, COMP_OFF, MAX_IO, REQ_OFF, SECTOR, SLOTS};
use wisp_abi::{errno, DeviceKind};

/// How long a request's completion is looked for before the vCPU parks.
const SPIN_NS: u64 = 100_000;

/// Why a disk operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The offset or length is not a whole number of 4 KiB sectors.
    Misaligned,
    /// Beyond the end of the disk.
    OutOfRange,
    /// A write to a read-only disk.
    ReadOnly,
    /// The host could not read or write the volume.
    Io,
    /// The monitor stopped the disk (the rings' rules were broken).
    Stopped,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Misaligned => "offset and length must be whole 4 KiB sectors",
            Error::OutOfRange => "beyond the end of the disk",
            Error::ReadOnly => "the disk is read-only",
            Error::Io => "I/O error on the host's volume",
            Error::Stopped => "the disk was stopped by the monitor",
        })
    }
}

/// A disk of the VM.
#[derive(Clone, Copy, Debug)]
pub struct Disk {
    index: u32,
    base: u64,
    capacity: u64,
    read_only: bool,
    doorbell: bool,
}

/// Every disk, in the order given (`--volume` order).
pub fn disks() -> impl Iterator<Item = Disk> {
    let info = crate::env::boot_info();
    let ram = info.mem_size;
    info.devices.iter().take(info.device_count as usize).enumerate().filter_map(move |(i, d)| {
        let fits = d.base.checked_add(blk::REGION_SIZE).is_some_and(|e| e <= ram) && d.size >= blk::REGION_SIZE;
        (d.kind == DeviceKind::Block as u32 && fits && d.base % 4096 == 0).then(|| Disk {
            index: i as u32,
            base: d.base,
            capacity: d.params[0] / SECTOR * SECTOR,
            read_only: d.params[1] & blk::flags::READ_ONLY != 0,
            doorbell: d.flags & wisp_abi::bootinfo::device_flags::DOORBELL != 0,
        })
    })
}

/// The first disk, if the VM has one.
pub fn disk() -> Option<Disk> {
    disks().next()
}

impl Disk {
    /// Bytes of the disk.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether writes are refused.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Read `buf.len()` bytes at `offset` (both whole sectors).
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.transfer(blk::op::READ, offset, buf.as_mut_ptr() as u64, buf.len() as u64)
    }

    /// Write `buf` at `offset` (both whole sectors).
    pub fn write(&self, offset: u64, buf: &[u8]) -> Result<(), Error> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        self.transfer(blk::op::WRITE, offset, buf.as_ptr() as u64, buf.len() as u64)
    }

    /// Make every completed write durable.
    pub fn flush(&self) -> Result<(), Error> {
        self.submit(&[(blk::op::FLUSH, 0, 0, 0)])
    }

    fn transfer(&self, op: u32, offset: u64, addr: u64, len: u64) -> Result<(), Error> {
        if offset % SECTOR != 0 || len % SECTOR != 0 {
            return Err(Error::Misaligned);
        }
        if offset.checked_add(len).is_none_or(|e| e > self.capacity) {
            return Err(Error::OutOfRange);
        }
        // Requests of at most MAX_IO, at most SLOTS at a time.
        let mut batch = [(0u32, 0u64, 0u64, 0u32); 16];
        let mut at = 0;
        while at < len {
            let mut n = 0;
            while n < batch.len() && at < len {
                let chunk = (len - at).min(MAX_IO as u64);
                batch[n] = (op, offset + at, addr + at, chunk as u32);
                n += 1;
                at += chunk;
            }
            self.submit(&batch[..n])?;
        }
        Ok(())
    }

    fn field(&self, off: u64) -> &'static AtomicU32 {
        // SAFETY: the region is page-aligned guest RAM the monitor reserved
        // for this disk (checked inside RAM in `disks`) for the VM's whole
        // life; the header's fields are aligned u32s shared with the
        // monitor, so atomics are the way to touch them.
        unsafe { &*((self.base + off) as *const AtomicU32) }
    }

    /// Queue `reqs` (op, offset, addr, len) and wait for their completions.
    fn submit(&self, reqs: &[(u32, u64, u64, u32)]) -> Result<(), Error> {
        if self.field(hdr::STOPPED).load(Ordering::Acquire) != 0 {
            return Err(Error::Stopped);
        }
        let prod = self.field(hdr::REQ_PROD).load(Ordering::Relaxed);
        for (i, &(op, offset, addr, len)) in reqs.iter().enumerate() {
            let slot = prod.wrapping_add(i as u32) % SLOTS;
            let r = BlkReq { op, tag: prod.wrapping_add(i as u32), offset, addr, len, reserved: 0 };
            // SAFETY: the slot lies in the request ring of this disk's
            // region (in RAM, checked in `disks`); the monitor reads it only
            // after `req_prod` says it is written (release below).
            unsafe { core::ptr::write_volatile((self.base + REQ_OFF + slot as u64 * 32) as *mut BlkReq, r) };
        }
        self.field(hdr::REQ_PROD).store(prod.wrapping_add(reqs.len() as u32), Ordering::Release);
        if self.field(hdr::MONITOR_IDLE).load(Ordering::Acquire) != 0 {
            if self.doorbell {
                crate::hypercall::doorbell(self.index);
            } else {
                crate::hypercall::notify(self.index);
            }
        }
        let mut result = Ok(());
        let mut left = reqs.len() as u32;
        let spin_until = crate::time::monotonic_ns() + SPIN_NS;
        while left > 0 {
            let cons = self.field(hdr::COMP_CONS).load(Ordering::Relaxed);
            let made = self.field(hdr::COMP_PROD).load(Ordering::Acquire);
            if made == cons {
                if self.field(hdr::STOPPED).load(Ordering::Acquire) != 0 {
                    return Err(Error::Stopped);
                }
                // A read the host's page cache serves completes within tens
                // of microseconds: looking again for a while costs less
                // than a park and a wake-up (two exits to the monitor).
                if crate::time::monotonic_ns() < spin_until {
                    core::hint::spin_loop();
                    continue;
                }
                let events = crate::hypercall::idle(u64::MAX);
                crate::process::dispatch_events(events);
                continue;
            }
            // SAFETY: as for the requests: the completion ring of this
            // disk's region, written before `comp_prod` (acquire above).
            let c: BlkComp = unsafe { core::ptr::read_volatile((self.base + COMP_OFF + (cons % SLOTS) as u64 * 16) as *const BlkComp) };
            if c.status != 0 && result.is_ok() {
                result = Err(if c.status as i64 == errno::EROFS { Error::ReadOnly } else { Error::Io });
            }
            self.field(hdr::COMP_CONS).store(cons.wrapping_add(1), Ordering::Release);
            left -= 1;
        }
        result
    }
}
