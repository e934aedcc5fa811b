//! Snapshots of a VM: the file format, read and checked before anything of
//! it is used. A snapshot is what a VM is at an exit — its vCPU, its
//! devices' parameters, the guest's leaf page tables, and the pages of
//! guest RAM that hold anything — so that a new VM can go on from there
//! (`vm/snapshot.rs` saves and restores; migration sends the same parts).
//!
//! ```text
//! [Header]                          magic "WISPSNAP", version, wisp ABI,
//!                                   RAM size, file length, SHA-256 digest,
//!                                   flags, the base's digest (incremental)
//! [vCPU]                            kvm_regs, kvm_fpu, TSC, guest clock
//! [devices]   n × 64 bytes          kind, region base and size, parameters
//! [PT0]       512 × u64             the first 2 MiB's 4 KiB page entries
//! [PD]        RAM / 2 MiB × u64     the 2 MiB page entries above
//! [runs]      n × (gpa, len, off)   where the saved pages go
//! (zeros to the next page)
//! [pages]                           the runs' bytes, back to back
//! ```
//!
//! Everything is little-endian and the pages start page-aligned, so a
//! restore maps them copy-on-write from the file: many VMs restored from
//! one snapshot share its pages until they write them. The digest covers
//! the whole file (with the digest field zeroed): a truncated or altered
//! file is refused. It is not a signature — who may restore what is the
//! toolstack's to say — so the monitor trusts nothing of a snapshot it
//! could not check: the special registers and the system pages are its
//! own, not the file's, and the page tables must be what it would write.
//!
//! An *incremental* snapshot ([`flags::INCREMENTAL`]) holds only the pages
//! written since the VM's previous snapshot, its base, whose digest it
//! names: restored over its base (and the base over its own), it is the
//! VM as it was (`Shell::restore_chain`).
//!
//! Format version [`VERSION`] is bumped when the layout changes; a
//! snapshot of another version, or made under another wisp ABI, is
//! refused with what it is.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;

use kvm_bindings::{kvm_fpu, kvm_regs};
use sha2::{Digest, Sha256};
use wisp_abi::layout::{align_up, LARGE_PAGE_SIZE, PAGE_SIZE};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::devices::DeviceState;

/// The first bytes of every snapshot.
pub const MAGIC: [u8; 8] = *b"WISPSNAP";
/// This monitor's snapshot format (2: flags and the base's digest).
pub const VERSION: u32 = 2;

/// Bits of [`Header::flags`].
pub mod flags {
    /// Only the pages written since the base (`Header::base_digest`).
    pub const INCREMENTAL: u32 = 1;
    /// Every flag this version knows.
    pub const ALL: u32 = INCREMENTAL;
}

/// The fixed start of a snapshot file.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: u32,
    /// `wisp_abi::ABI_VERSION` of the monitor that saved it.
    pub abi_version: u32,
    /// Bytes of guest RAM.
    pub mem_size: u64,
    /// Bytes of the whole file.
    pub file_len: u64,
    /// SHA-256 of the file with this field zeroed.
    pub digest: [u8; 32],
    /// The features the guest's image declared (its hypercalls).
    pub features: u64,
    pub n_devices: u32,
    pub n_runs: u32,
    /// Where the pages start (page aligned).
    pub data_offset: u64,
    /// [`flags`].
    pub flags: u32,
    pub _pad: u32,
    /// An incremental snapshot's base: its digest (else zeros).
    pub base_digest: [u8; 32],
}

/// The vCPU as saved (the special registers are not: a restored VM gets
/// the monitor's own).
#[derive(Clone, Debug)]
pub struct Vcpu {
    pub regs: kvm_regs,
    pub fpu: kvm_fpu,
    /// The guest's time-stamp counter.
    pub tsc: u64,
    /// The guest's monotonic clock (ns since its boot).
    pub clock_ns: u64,
}

/// A device as saved.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
struct DeviceRecord {
    kind: u32,
    _pad: u32,
    base: u64,
    size: u64,
    params: [u64; 5],
}

/// Pages of guest RAM at `gpa`, `len` bytes, at `offset` in the file.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Run {
    pub gpa: u64,
    pub len: u64,
    pub offset: u64,
}

const HEADER: usize = size_of::<Header>();
const REGS: usize = size_of::<kvm_regs>();
const FPU: usize = size_of::<kvm_fpu>();
const VCPU: usize = REGS + FPU + 16;
const DEVICE: usize = size_of::<DeviceRecord>();
const RUN: usize = size_of::<Run>();
const PT0_ENTRIES: usize = 512;
const DIGEST: std::ops::Range<usize> = std::mem::offset_of!(Header, digest)..std::mem::offset_of!(Header, digest) + 32;
const BASE: std::ops::Range<usize> = std::mem::offset_of!(Header, base_digest)..std::mem::offset_of!(Header, base_digest) + 32;

/// Guest RAM the monitor writes itself (descriptor tables, exception stubs
/// and stack, page tables): never taken from a snapshot.
pub const SYSTEM_PAGES: std::ops::Range<u64> = wisp_abi::layout::GDT..wisp_abi::layout::PREFAULT_PAGE;

/// Why a snapshot was refused (defined beside the monitor's other errors,
/// which carry it).
pub use crate::error::SnapshotError as Error;

fn malformed(s: impl Into<String>) -> Error {
    Error::Malformed(s.into())
}

/// A snapshot's parts, checked (its pages stay in the file).
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub header: Header,
    pub vcpu: Vcpu,
    pub devices: Vec<DeviceState>,
    /// The guest's leaf page tables as saved: the first 2 MiB's entries and
    /// the 2 MiB entries of RAM (the restore checks them against what the
    /// monitor would write).
    pub pt0: Vec<u64>,
    pub pd: Vec<u64>,
    pub runs: Vec<Run>,
}

impl Snapshot {
    /// Bytes before the pages: header and tables, padded to a page.
    fn head_len(n_devices: usize, n_pd: usize, n_runs: usize) -> u64 {
        align_up((HEADER + VCPU + n_devices * DEVICE + (PT0_ENTRIES + n_pd) * 8 + n_runs * RUN) as u64, PAGE_SIZE)
    }

    /// The header and tables (digest zero), padded to where the pages
    /// start. `runs` must be laid out back to back from there
    /// ([`Snapshot::lay_out`]).
    pub fn encode_head(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.header.data_offset as usize);
        out.extend_from_slice(self.header.as_bytes());
        out.extend_from_slice(self.vcpu.regs.as_bytes());
        out.extend_from_slice(&fpu_bytes(&self.vcpu.fpu));
        out.extend_from_slice(&self.vcpu.tsc.to_le_bytes());
        out.extend_from_slice(&self.vcpu.clock_ns.to_le_bytes());
        for d in &self.devices {
            out.extend_from_slice(DeviceRecord { kind: d.kind, _pad: 0, base: d.base, size: d.size, params: d.params }.as_bytes());
        }
        for e in self.pt0.iter().chain(&self.pd) {
            out.extend_from_slice(&e.to_le_bytes());
        }
        for r in &self.runs {
            out.extend_from_slice(r.as_bytes());
        }
        out.resize(self.header.data_offset as usize, 0);
        out
    }

    /// A snapshot of these parts, its runs (gpa, len) laid out after its
    /// tables: header filled in, digest zero.
    #[allow(clippy::too_many_arguments)]
    pub fn lay_out(mem_size: u64, features: u64, vcpu: Vcpu, devices: Vec<DeviceState>, pt0: Vec<u64>, pd: Vec<u64>, runs: &[(u64, u64)]) -> Snapshot {
        let data_offset = Self::head_len(devices.len(), pd.len(), runs.len());
        let mut at = data_offset;
        let runs: Vec<Run> = runs
            .iter()
            .map(|&(gpa, len)| {
                let r = Run { gpa, len, offset: at };
                at += len;
                r
            })
            .collect();
        let header = Header {
            magic: MAGIC,
            version: VERSION,
            abi_version: wisp_abi::ABI_VERSION,
            mem_size,
            file_len: at,
            digest: [0; 32],
            features,
            n_devices: devices.len() as u32,
            n_runs: runs.len() as u32,
            data_offset,
            flags: 0,
            _pad: 0,
            base_digest: [0; 32],
        };
        Snapshot { header, vcpu, devices, pt0, pd, runs }
    }

    /// Parse and check the start of a snapshot (`head`: at least its
    /// header and tables) of a file of `file_len` bytes: every field
    /// against the others and against the file's length. The pages and
    /// the digest are not read.
    pub fn parse(head: &[u8], file_len: u64) -> Result<Snapshot, Error> {
        if head.len() < 8 || head[..8] != MAGIC {
            return Err(if head.len() < 8 && MAGIC.starts_with(head) { Error::Truncated { have: file_len, want: HEADER as u64 } } else { Error::Foreign });
        }
        let header = Header::read_from_prefix(head).map_err(|_| Error::Truncated { have: file_len, want: HEADER as u64 })?.0;
        if header.version != VERSION {
            return Err(Error::Version { found: header.version, want: VERSION });
        }
        if header.abi_version != wisp_abi::ABI_VERSION {
            return Err(Error::Abi { found: header.abi_version });
        }
        if header.flags & !flags::ALL != 0 || header._pad != 0 {
            return Err(malformed(format!("unknown flags {:#x}", header.flags & !flags::ALL)));
        }
        if (header.flags & flags::INCREMENTAL != 0) != (header.base_digest != [0; 32]) {
            return Err(malformed("an incremental snapshot names its base, and only it"));
        }
        if file_len < header.file_len {
            return Err(Error::Truncated { have: file_len, want: header.file_len });
        }
        if file_len > header.file_len {
            return Err(malformed(format!("{} bytes after its end", file_len - header.file_len)));
        }
        let mem = header.mem_size;
        if crate::shell::check_mem_size(mem).ok() != Some(mem) {
            return Err(malformed(format!("guest RAM of {mem} bytes is not a size a VM can have")));
        }
        if header.n_devices as usize > wisp_abi::bootinfo::MAX_DEVICES {
            return Err(malformed(format!("{} devices, at most {}", header.n_devices, wisp_abi::bootinfo::MAX_DEVICES)));
        }
        let n_pd = (mem / LARGE_PAGE_SIZE) as usize;
        let n_runs = header.n_runs as usize;
        if n_runs as u64 > mem / PAGE_SIZE {
            return Err(malformed(format!("{n_runs} runs of pages, more than RAM has pages")));
        }
        let data_offset = Self::head_len(header.n_devices as usize, n_pd, n_runs);
        if header.data_offset != data_offset {
            return Err(malformed(format!("pages at {:#x}, the tables end at {data_offset:#x}", header.data_offset)));
        }
        if data_offset > header.file_len {
            return Err(Error::Truncated { have: file_len, want: data_offset });
        }
        if (head.len() as u64) < data_offset {
            return Err(Error::Truncated { have: head.len() as u64, want: data_offset });
        }
        let mut at = HEADER;
        let mut take = |n: usize| {
            let s = &head[at..at + n];
            at += n;
            s
        };
        let regs = kvm_regs::read_from_bytes(take(REGS)).map_err(|_| malformed("registers"))?;
        let fpu = fpu_from(take(FPU));
        if fpu.mxcsr & !0xffff != 0 {
            return Err(malformed(format!("MXCSR {:#x} has reserved bits set", fpu.mxcsr)));
        }
        let tsc = u64::from_le_bytes(take(8).try_into().expect("8 bytes"));
        let clock_ns = u64::from_le_bytes(take(8).try_into().expect("8 bytes"));
        let mut devices = Vec::with_capacity(header.n_devices as usize);
        for _ in 0..header.n_devices {
            let d = DeviceRecord::read_from_bytes(take(DEVICE)).map_err(|_| malformed("device record"))?;
            devices.push(DeviceState { kind: d.kind, base: d.base, size: d.size, params: d.params });
        }
        let mut words = |n: usize| -> Vec<u64> { take(n * 8).chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect() };
        let pt0 = words(PT0_ENTRIES);
        let pd = words(n_pd);
        let mut runs = Vec::with_capacity(n_runs);
        let mut offset = data_offset;
        let mut end = 0u64;
        for i in 0..n_runs {
            let r = Run::read_from_bytes(take(RUN)).map_err(|_| malformed("run record"))?;
            let ok = r.len > 0
                && r.gpa.is_multiple_of(PAGE_SIZE)
                && r.len.is_multiple_of(PAGE_SIZE)
                && r.gpa >= end
                && r.gpa.checked_add(r.len).is_some_and(|e| e <= mem)
                && r.offset == offset;
            if !ok {
                return Err(malformed(format!("run {i} ({:#x}+{:#x} at {:#x}) is not page aligned, in order, inside RAM and next in the file", r.gpa, r.len, r.offset)));
            }
            if r.gpa < SYSTEM_PAGES.end && r.gpa + r.len > SYSTEM_PAGES.start {
                return Err(malformed(format!("run {i} ({:#x}+{:#x}) covers the monitor's own pages", r.gpa, r.len)));
            }
            end = r.gpa + r.len;
            offset += r.len;
            runs.push(r);
        }
        if offset != header.file_len {
            return Err(malformed(format!("the runs end at {offset:#x}, the file at {:#x}", header.file_len)));
        }
        Ok(Snapshot { header, vcpu: Vcpu { regs, fpu, tsc, clock_ns }, devices, pt0, pd, runs })
    }

    /// Read and check a snapshot file (its digest too if `verify`: every
    /// byte is read once).
    pub fn read(file: &File, verify: bool) -> Result<Snapshot, Error> {
        let io = |e: std::io::Error| Error::Io(e.to_string());
        let len = file.metadata().map_err(io)?.len();
        let mut head = vec![0u8; HEADER.min(len as usize)];
        file.read_exact_at(&mut head, 0).map_err(io)?;
        // The header says how long the tables are (checked in `parse`).
        let want = match Header::read_from_prefix(&head) {
            Ok((h, _)) if h.magic == MAGIC && h.version == VERSION && h.data_offset <= len && h.data_offset <= (64 << 20) => h.data_offset as usize,
            _ => head.len(),
        };
        head.resize(want, 0);
        file.read_exact_at(&mut head[..], 0).map_err(io)?;
        let snap = Snapshot::parse(&head, len)?;
        if verify && digest_file(file).map_err(io)? != snap.header.digest {
            return Err(Error::Digest);
        }
        Ok(snap)
    }
}

/// The x87/SSE state as bytes, field by field (kvm_fpu has no byte view of
/// its own).
fn fpu_bytes(f: &kvm_fpu) -> Vec<u8> {
    let mut v = Vec::with_capacity(FPU);
    f.fpr.iter().for_each(|r| v.extend_from_slice(r));
    v.extend_from_slice(&f.fcw.to_le_bytes());
    v.extend_from_slice(&f.fsw.to_le_bytes());
    v.extend_from_slice(&[f.ftwx, 0]);
    v.extend_from_slice(&f.last_opcode.to_le_bytes());
    v.extend_from_slice(&f.last_ip.to_le_bytes());
    v.extend_from_slice(&f.last_dp.to_le_bytes());
    f.xmm.iter().for_each(|r| v.extend_from_slice(r));
    v.extend_from_slice(&f.mxcsr.to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v
}

fn fpu_from(b: &[u8]) -> kvm_fpu {
    let mut f = kvm_fpu::default();
    let mut at = 0;
    let mut take = |n: usize| {
        let s = &b[at..at + n];
        at += n;
        s
    };
    for r in &mut f.fpr {
        r.copy_from_slice(take(16));
    }
    f.fcw = u16::from_le_bytes(take(2).try_into().expect("2"));
    f.fsw = u16::from_le_bytes(take(2).try_into().expect("2"));
    f.ftwx = take(2)[0];
    f.last_opcode = u16::from_le_bytes(take(2).try_into().expect("2"));
    f.last_ip = u64::from_le_bytes(take(8).try_into().expect("8"));
    f.last_dp = u64::from_le_bytes(take(8).try_into().expect("8"));
    for r in &mut f.xmm {
        r.copy_from_slice(take(16));
    }
    f.mxcsr = u32::from_le_bytes(take(4).try_into().expect("4"));
    f
}

const _: () = assert!(FPU == 128 + 8 + 16 + 256 + 8);

/// The buffer a file or stream is read through: under the allocator's
/// mapping threshold (128 KiB), so it comes from the heap already touched
/// instead of a fresh mapping faulted in and torn down each time (a
/// quarter to half a millisecond here for a 1 MiB one).
const COPY_BUF: usize = 64 << 10;

/// SHA-256 of a snapshot file with its digest field read as zeros.
pub fn digest_file(file: &File) -> std::io::Result<[u8; 32]> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; COPY_BUF];
    let mut at = 0u64;
    loop {
        let n = file.read_at(&mut buf, at)?;
        if n == 0 {
            break;
        }
        let chunk = &mut buf[..n];
        // Zero whatever part of the digest field this chunk holds.
        for i in DIGEST {
            let i = i as u64;
            if i >= at && i < at + n as u64 {
                chunk[(i - at) as usize] = 0;
            }
        }
        h.update(&*chunk);
        at += n as u64;
    }
    Ok(h.finalize().into())
}

/// Compute a written snapshot file's digest and put it in its header.
pub fn seal(file: &File) -> std::io::Result<[u8; 32]> {
    let d = digest_file(file)?;
    file.write_all_at(&d, DIGEST.start as u64)?;
    Ok(d)
}

/// Read a snapshot stream (header, tables, pages, in that order, from a
/// VMM process or a peer: untrusted) into `file`, checking its head before
/// anything else is written and its length as it comes; seal it. The
/// stream's own digest field is ignored: the digest is computed here.
pub fn receive(stream: &mut dyn Read, file: &File, mem_limit: u64) -> Result<Snapshot, Error> {
    receive_over(stream, file, mem_limit, None)
}

/// [`receive`] of a stream that may be incremental: such a snapshot is
/// laid over `base` (the digest of the VM's previous snapshot, which the
/// receiver knows; the stream's own field is ignored). An incremental
/// stream with no base known is refused.
pub fn receive_over(stream: &mut dyn Read, file: &File, mem_limit: u64, base: Option<[u8; 32]>) -> Result<Snapshot, Error> {
    let io = |e: std::io::Error| Error::Io(e.to_string());
    let mut head = vec![0u8; HEADER];
    let short = |e: std::io::Error| if e.kind() == std::io::ErrorKind::UnexpectedEof { Error::Truncated { have: 0, want: HEADER as u64 } } else { io(e) };
    // The magic first: a stream of something else is named so, however short.
    stream.read_exact(&mut head[..8]).map_err(short)?;
    if head[..8] != MAGIC {
        return Err(Error::Foreign);
    }
    stream.read_exact(&mut head[8..]).map_err(short)?;
    let h = Header::read_from_bytes(&head).map_err(|_| Error::Foreign)?;
    if h.mem_size > mem_limit {
        return Err(Error::Memory { want: h.mem_size >> 20, have: mem_limit >> 20 });
    }
    if h.version != VERSION {
        return Err(Error::Version { found: h.version, want: VERSION });
    }
    if h.data_offset > (64 << 20) || h.data_offset < HEADER as u64 {
        return Err(malformed(format!("pages at {:#x}", h.data_offset)));
    }
    head.resize(h.data_offset as usize, 0);
    stream.read_exact(&mut head[HEADER..]).map_err(|_| Error::Truncated { have: 0, want: h.data_offset })?;
    // The base is the receiver's to name.
    if h.flags & flags::INCREMENTAL != 0 {
        let base = base.ok_or_else(|| malformed("an incremental snapshot with no earlier snapshot of its VM to build on"))?;
        head[BASE].copy_from_slice(&base);
    } else {
        head[BASE].fill(0);
    }
    let snap = Snapshot::parse(&head, h.file_len)?;
    head[DIGEST].fill(0);
    file.set_len(0).map_err(io)?;
    file.write_all_at(&head, 0).map_err(io)?;
    // Hashed as written (no second read of the file).
    let mut hash = Sha256::new();
    hash.update(&head);
    let mut at = h.data_offset;
    let mut buf = vec![0u8; COPY_BUF];
    while at < h.file_len {
        let want = buf.len().min((h.file_len - at) as usize);
        let n = stream.read(&mut buf[..want]).map_err(io)?;
        if n == 0 {
            return Err(Error::Truncated { have: at, want: h.file_len });
        }
        file.write_all_at(&buf[..n], at).map_err(io)?;
        hash.update(&buf[..n]);
        at += n as u64;
    }
    let mut extra = [0u8; 1];
    if stream.read(&mut extra).map_err(io)? != 0 {
        return Err(malformed("the stream goes on after the snapshot's end"));
    }
    let digest: [u8; 32] = hash.finalize().into();
    file.write_all_at(&digest, DIGEST.start as u64).map_err(io)?;
    Ok(Snapshot { header: Header { digest, ..snap.header }, ..snap })
}

#[cfg(test)]
mod tests;
