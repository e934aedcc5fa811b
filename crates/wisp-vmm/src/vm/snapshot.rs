//! Snapshots taken and restored (the format: `crate::snapshot`).
//!
//! Taken on the vCPU thread at an exit ([`Control::save`] asks for one; a
//! paused VM is saved as it is, an idle one woken for it): the vCPU state
//! through `state.rs`, the devices' parameters, the guest's leaf page
//! tables, and the pages of guest RAM that hold anything but the monitor's
//! own, streamed to the sink. Restored into a shell of the same RAM size:
//! fresh RAM, the pages mapped copy-on-write from the snapshot file, the
//! monitor's own pages and special registers written anew, the page tables
//! checked, the devices given their parameters, and the guest's registers,
//! FPU, TSC and clock put back. A restored VM is the root of a family of
//! its own.

use std::io::Write;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use super::Vm;
use crate::arch;
use crate::control::{SaveSink, Saved};
use crate::devices::{Device, Devices};
use crate::error::{Error, Result};
use crate::shell::Shell;
use crate::snapshot::{self, Snapshot, SYSTEM_PAGES};
use crate::state::{self, VcpuState};

/// Bytes of guest RAM copied out per write: under the allocator's mapping
/// threshold (128 KiB), so the buffer is heap already touched, not a fresh
/// mapping faulted in and torn down (with its TLB shootdown) per snapshot.
const CHUNK: usize = 64 << 10;

/// RFLAGS bits a restored guest keeps (the arithmetic flags and the
/// direction flag; everything else is the monitor's: bit 1 set, no IOPL,
/// no traps, no interrupts).
const USER_FLAGS: u64 = 0x0cd5;

impl Vm {
    /// Make this VM a template: when its guest says it is ready (the
    /// `ready` hypercall), write a snapshot of it to `sink` and end it
    /// (exit status 0 once written, 1 if the snapshot failed). A guest
    /// that never says so runs as any other.
    pub fn save_when_ready(&mut self, sink: SaveSink) {
        self.on_ready = Some(sink);
    }

    /// The `ready` hypercall.
    pub(super) fn ready(&mut self, gpa: u64, declared: bool) -> super::hypercall::Served {
        use wisp_abi::{args, Hypercall};
        let hc = Hypercall::Ready;
        let mut a: args::Ready = super::hypercall::read_block(&self.shell.ram, &self.user, hc, gpa, true)?;
        if !declared {
            a.ret = wisp_abi::errno::ENOSYS;
            return super::hypercall::write_block(&self.shell.ram, hc, gpa, &a);
        }
        // The answer goes into guest RAM before the snapshot: instances
        // see the call succeed.
        a.ret = 0;
        super::hypercall::write_block(&self.shell.ram, hc, gpa, &a)?;
        // A reusable VM keeps its ready point instead (`reuse.rs`).
        if self.stops_at_ready() {
            return Ok(Some(0));
        }
        let Some(mut sink) = self.on_ready.take() else { return Ok(None) };
        let saved = self.write_snapshot(&mut sink, false).map_err(|e| e.to_string()).and_then(|_| sink.flush().map_err(|e| e.to_string()));
        drop(sink);
        match saved {
            Ok(()) => Ok(Some(0)),
            Err(e) => {
                crate::sys::stderr_line(&format!("wisp-vmm: template snapshot: {e}"));
                Ok(Some(1))
            }
        }
    }

    /// Serve a snapshot asked for through the control block.
    pub(super) fn serve_save(&mut self, mut sink: SaveSink, incremental: bool) {
        let t = Instant::now();
        let r = self.write_snapshot(&mut sink, incremental).map_err(|e| e.to_string());
        let r = r.and_then(|(bytes, ram_bytes)| sink.flush().map(|_| (bytes, ram_bytes)).map_err(|e| format!("snapshot stream: {e}")));
        drop(sink);
        self.control.saved(r.map(|(bytes, ram_bytes)| Saved { bytes, ram_bytes, held_us: t.elapsed().as_micros() as u64 }));
    }

    /// Write a snapshot of this VM to `out` (its digest field zero: the
    /// receiver seals it): of the pages that hold anything, or with
    /// `incremental` of those written since its last snapshot (the guest's,
    /// from KVM's dirty log, and the monitor's, from guest RAM's bitmap).
    /// From the first one on, the pages written are logged for the next.
    /// Returns the bytes written and the bytes of RAM.
    pub(crate) fn write_snapshot(&mut self, out: &mut dyn Write, incremental: bool) -> Result<(u64, u64)> {
        if incremental && !self.shell.dirty_log {
            return Err(Error::Unsupported("an incremental snapshot needs an earlier snapshot of this VM to build on".into()));
        }
        // The devices hold still while the VM is read: their threads write
        // guest RAM too.
        let devices = std::mem::take(&mut self.devices);
        let mut r = Err(Error::Unsupported("no snapshot taken".into()));
        let held = devices.quiesced(&mut || r = self.write_held(out, incremental, &devices));
        self.devices = devices;
        held?;
        r
    }

    /// [`Vm::write_snapshot`] with the devices (taken out of `self`) held.
    fn write_held(&mut self, out: &mut dyn Write, incremental: bool, devices: &Devices) -> Result<(u64, u64)> {
        let st = crate::state::VmState { vcpu: state::save_vcpu(&mut self.shell.vcpu, self.shell.sync_regs)?, devices: devices.save_state() };
        let clock_ns = self.boot.elapsed().as_nanos() as u64;
        let (pt0, pd) = arch::leaf_tables(&self.shell.ram)?;
        // The log from here on is the next snapshot's: read (and cleared,
        // or started) while the vCPU is held.
        let mut written = self.shell.dirty_pages()?;
        self.shell.ram.take_written(&mut written);
        let pages = if incremental {
            bit_runs(&written)
        } else {
            let mut scratch = Vec::new();
            self.shell.ram.resident(u64::MAX, &mut scratch)?.unwrap_or_default()
        };
        let runs = without(&merge(&pages, RUN_GAP), SYSTEM_PAGES.start, SYSTEM_PAGES.end);
        let vcpu = snapshot::Vcpu { regs: st.vcpu.regs, fpu: st.vcpu.fpu, tsc: st.vcpu.tsc, clock_ns };
        let mut snap = Snapshot::lay_out(self.shell.ram.size(), self.features, vcpu, st.devices, pt0, pd, &runs);
        if incremental {
            // The base is the receiver's to name (it knows the last digest).
            snap.header.flags |= snapshot::flags::INCREMENTAL;
            snap.header.base_digest = [0xff; 32];
        }
        let io = |e: std::io::Error| Error::Host("write the snapshot", e);
        out.write_all(&snap.encode_head()).map_err(io)?;
        let mut buf = vec![0u8; CHUNK];
        let mut ram_bytes = 0;
        for r in &snap.runs {
            let mut at = r.gpa;
            while at < r.gpa + r.len {
                let n = CHUNK.min((r.gpa + r.len - at) as usize);
                self.shell.ram.read(at, &mut buf[..n])?;
                out.write_all(&buf[..n]).map_err(io)?;
                at += n as u64;
            }
            ram_bytes += r.len;
        }
        Ok((snap.header.file_len, ram_bytes))
    }
}

/// The pages whose bits are set in `bits` (one a page), as runs.
fn bit_runs(bits: &[u64]) -> Vec<(u64, u64)> {
    let page = wisp_abi::layout::PAGE_SIZE;
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (i, &w) in bits.iter().enumerate() {
        let mut w = w;
        while w != 0 {
            let b = w.trailing_zeros() as u64;
            w &= w - 1;
            let gpa = (i as u64 * 64 + b) * page;
            match runs.last_mut() {
                Some((s, l)) if *s + *l == gpa => *l += page,
                _ => runs.push((gpa, page)),
            }
        }
    }
    runs
}

/// Runs of saved pages closer than this merge (the zeros between them are
/// saved too): a restore maps each run with a call of its own.
const RUN_GAP: u64 = 64 << 10;

/// `runs` (sorted, disjoint), those less than `gap` apart merged.
fn merge(runs: &[(u64, u64)], gap: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
    for &(a, len) in runs {
        match out.last_mut() {
            Some((s, l)) if a >= *s + *l && a - (*s + *l) <= gap => *l = a + len - *s,
            _ => out.push((a, len)),
        }
    }
    out
}

/// `runs` (sorted, disjoint) less `[start, end)`.
fn without(runs: &[(u64, u64)], start: u64, end: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(runs.len() + 1);
    for &(a, len) in runs {
        let b = a + len;
        if b <= start || a >= end {
            out.push((a, len));
            continue;
        }
        if a < start {
            out.push((a, start - a));
        }
        if b > end {
            out.push((end, b - end));
        }
    }
    out
}

impl Shell {
    /// A VM restored from `snap` (read and checked from `file`, which holds
    /// its pages): this shell's RAM must be the snapshot's size, and
    /// `devices` the snapshot's (same kinds, same order; a NIC takes over
    /// the saved identity). The VM runs on from where it was saved.
    pub fn restore(self, snap: &Snapshot, file: BorrowedFd<'_>, devices: Vec<Box<dyn Device>>) -> Result<Vm> {
        self.restore_chain(&[(snap, file)], devices)
    }

    /// A VM restored from a full snapshot and the incremental ones made
    /// after it, oldest first: each one's base is the one before it (by
    /// digest), and their pages are laid over each other in that order;
    /// the vCPU, devices and page tables are the last one's.
    pub fn restore_chain(self, chain: &[(&Snapshot, BorrowedFd<'_>)], devices: Vec<Box<dyn Device>>) -> Result<Vm> {
        self.begin_restore(chain, devices)?.finish()
    }

    /// [`Shell::restore_chain`] up to the VM itself: RAM holds the chain's
    /// pages and the devices are placed (not started). More increments can
    /// be laid over it ([`Restoring::over`]) before it becomes the VM
    /// ([`Restoring::finish`]): a migration's destination restores the
    /// whole snapshot while the source takes the last increment.
    pub fn begin_restore(mut self, chain: &[(&Snapshot, BorrowedFd<'_>)], devices: Vec<Box<dyn Device>>) -> Result<Restoring> {
        let t = Instant::now();
        let Some(&(snap, _)) = chain.last() else {
            return Err(snapshot::Error::Malformed("no snapshot to restore".into()).into());
        };
        for (i, (s, _)) in chain.iter().enumerate() {
            let incremental = s.header.flags & snapshot::flags::INCREMENTAL != 0;
            match i {
                0 if incremental => return Err(snapshot::Error::Malformed("an incremental snapshot needs its base restored with it".into()).into()),
                0 => {}
                _ => laid_over(s, chain[i - 1].0, i + 1)?,
            }
        }
        let h = &snap.header;
        if h.mem_size != self.ram.size() {
            return Err(snapshot::Error::Memory { want: h.mem_size >> 20, have: self.ram.size() >> 20 }.into());
        }
        features_known(h.features)?;
        let mut devices = Devices::new(devices)?;
        // (Sizes from a snapshot's devices are the snapshot's word.)
        if devices.ram_taken() >= self.ram.size() {
            return Err(Error::Devices(format!("the saved devices take {} bytes of a {}-byte RAM", devices.ram_taken(), self.ram.size())));
        }
        devices.place(self.ram.size());
        devices.restore_state(&snap.devices)?;
        // RAM as a new shell has it (a pooled shell ran its warm-up code or
        // holds a preloaded image), then the snapshot's pages over it.
        if self.warmed || self.preloaded.is_some() {
            self.preloaded = None;
            self.ram.map_zero()?;
            arch::write_system_pages(&self.ram)?;
        }
        self.stats.phase("restore_clear", t);
        let t2 = Instant::now();
        for (s, file) in chain {
            let runs: Vec<(u64, u64, u64)> = s.runs.iter().map(|r| (r.gpa, r.len, r.offset)).collect();
            self.ram.map_runs(*file, &runs)?;
        }
        self.stats.phase("restore_map", t2);
        Ok(Restoring { shell: self, devices, last: snap.clone(), began: t })
    }
}

/// Snapshot `s` (number `n` of a chain) must be an increment made over
/// `base`, of the same RAM size.
fn laid_over(s: &Snapshot, base: &Snapshot, n: usize) -> Result<()> {
    let why = if s.header.flags & snapshot::flags::INCREMENTAL == 0 {
        format!("snapshot {n} of the chain is a full one, not laid over another")
    } else if s.header.base_digest != base.header.digest {
        format!("snapshot {n} of the chain was not made over the one before it")
    } else if s.header.mem_size != base.header.mem_size {
        format!("snapshot {n} of the chain is of another RAM size")
    } else {
        return Ok(());
    };
    Err(snapshot::Error::Malformed(why).into())
}

/// A guest's features must all be this monitor's.
fn features_known(features: u64) -> Result<()> {
    if features & !super::FEATURES != 0 {
        return Err(Error::Unsupported(format!("the snapshot's guest uses features {:#x} this monitor lacks", features & !super::FEATURES)));
    }
    Ok(())
}

/// A restore under way ([`Shell::begin_restore`]): guest RAM holds the
/// pages restored so far; the vCPU, page tables and devices' parameters
/// will be the last snapshot's.
pub struct Restoring {
    shell: Shell,
    devices: Devices,
    /// The last snapshot laid (the next one's base).
    last: Snapshot,
    began: Instant,
}

impl Restoring {
    /// Lay increment `inc` (read and checked from `file`) over what is
    /// restored: it must have been made over the last snapshot laid.
    pub fn over(&mut self, inc: &Snapshot, file: BorrowedFd<'_>) -> Result<()> {
        laid_over(inc, &self.last, 2)?;
        features_known(inc.header.features)?;
        self.devices.restore_state(&inc.devices)?;
        let t = Instant::now();
        let runs: Vec<(u64, u64, u64)> = inc.runs.iter().map(|r| (r.gpa, r.len, r.offset)).collect();
        self.shell.ram.map_runs(file, &runs)?;
        self.shell.stats.phase("restore_map", t);
        self.last = inc.clone();
        Ok(())
    }

    /// The VM: the last snapshot's page tables (checked against what the
    /// monitor writes), vCPU and clock; its devices start.
    pub fn finish(self) -> Result<Vm> {
        let Restoring { mut shell, devices, last: snap, began } = self;
        let t2 = Instant::now();
        let user = arch::restore_tables(&shell.ram, &snap.pt0, &snap.pd).map_err(snapshot::Error::Malformed)?;
        shell.stats.phase("restore_tables", t2);
        let t2 = Instant::now();
        // The monitor's own special registers (set with the rest below:
        // loading CR3 again drops KVM's translations of the old tables).
        let mut sregs = shell.vcpu.get_sregs().map_err(|e| Error::Kvm("get sregs", e.into()))?;
        arch::set_sregs(&mut sregs);
        let mut regs = snap.vcpu.regs;
        regs.rflags = (regs.rflags & USER_FLAGS) | 0x2;
        state::restore_vcpu(&shell.vcpu, &VcpuState { regs, sregs, fpu: snap.vcpu.fpu, tsc: snap.vcpu.tsc })?;
        shell.stats.phase("restore_vcpu", t2);
        shell.stats.phase("restore", began);
        let now = Instant::now();
        let boot = now.checked_sub(Duration::from_nanos(snap.vcpu.clock_ns)).unwrap_or(now);
        Vm::assemble(shell, devices, snap.header.features, user, boot)
    }
}

#[cfg(test)]
mod tests {
    use super::{bit_runs, merge, without};

    #[test]
    fn set_bits_are_runs_of_pages() {
        assert_eq!(bit_runs(&[0b1011, 0, 1 << 63, 1]), [(0, 0x2000), (0x3000, 0x1000), (191 * 0x1000, 0x2000)]);
        assert!(bit_runs(&[0, 0]).is_empty());
    }

    #[test]
    fn runs_close_together_merge() {
        let runs = [(0x1000, 0x1000), (0x3000, 0x1000), (0x10_0000, 0x1000)];
        assert_eq!(merge(&runs, 0x1000), [(0x1000, 0x3000), (0x10_0000, 0x1000)]);
        assert_eq!(merge(&runs, 0), runs);
    }

    #[test]
    fn the_monitors_pages_are_cut_out_of_the_runs() {
        let runs = [(0x1000, 0x1000), (0x2000, 0xd000), (0x10_0000, 0x2000)];
        assert_eq!(without(&runs, 0x2000, 0xe000), [(0x1000, 0x1000), (0xe000, 0x1000), (0x10_0000, 0x2000)]);
        assert_eq!(without(&[(0, 0x20000)], 0x2000, 0xe000), [(0, 0x2000), (0xe000, 0x12000)]);
        assert_eq!(without(&[(0x3000, 0x1000)], 0x2000, 0xe000), []);
    }
}
