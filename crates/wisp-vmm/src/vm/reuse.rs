//! A VM run again and again (issue 17, recycling; KylinX §3.3.3;
//! `docs/libraries.md` "Recycling"): the guest boots once, says it is
//! ready (the `ready` hypercall, where a template would be saved), and the
//! monitor keeps that *ready point* — the vCPU's registers, the pages of
//! RAM that hold anything, the bytes of every library's writable segments.
//! Each run then writes its arguments into the boot-info page and lets the
//! guest go on from the ready point; when the guest exits, the VM is
//! scrubbed back to the ready point and waits for the next run:
//!
//! - guest RAM gets its ready-point bytes back, copied into the same host
//!   pages (so the guest's translations of them stay: no fault in the next
//!   run). A small ready point (at most [`COPY_ALL_PAGES`] pages that hold
//!   anything: a recycler's is 18) is copied back whole, and every page
//!   that has come to hold anything since is zeroed, with no dirty log: a
//!   page KVM logs is write-protected again after each read of the log,
//!   and the guest's first write to it in the next run faults. A larger
//!   one gets back only the pages written since (the guest's, from KVM's
//!   dirty log, which starts at the ready point; the monitor's own, from
//!   guest RAM's bitmap), or zeros if they held none;
//! - the libraries' writable bytes are put back;
//! - the registers, special registers and FPU state are the ready point's
//!   (not the time-stamp counter: the guest's clocks go on; the special
//!   registers are set only if they changed, which keeps KVM's
//!   translations of guest pages);
//! - a kill or timeout asked for and events not taken are forgotten.
//!
//! Nothing of one run is left for the next but the time that passed. The
//! run loop (`mod.rs`) returns at the ready point and at the exit of a run
//! instead of ending the VM; the embedder (`wisp-vmm-process`'s recycling
//! group) decides what comes next.

use wisp_abi::layout::{BOOT_INFO, PAGE_SIZE};
use wisp_abi::BootInfo;

use super::Vm;
use crate::error::{Error, Result};
use crate::state::{self, VcpuState};

/// What a reusable VM keeps.
pub(super) struct Reuse {
    point: Option<Point>,
    /// Why the run loop returned, until the embedder acts on it.
    pub(super) stop: Option<Stop>,
    /// Runs scrubbed so far.
    runs: u64,
    /// Ready points of at most this many pages are put back whole.
    copy_all: usize,
}

/// Where the run loop of a reusable VM stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// At the guest's ready call (the first: later ones do nothing).
    Ready,
    /// The run's guest exited with this code.
    Ended(i32),
}

/// Ready points of at most this many pages that hold anything are put
/// back whole, with no dirty log (the module says why).
pub const COPY_ALL_PAGES: usize = 512;

/// The ready point.
struct Point {
    /// Scrubbed from KVM's dirty log (else: put back whole).
    logged: bool,
    vcpu: VcpuState,
    /// Runs of pages that held anything, with their bytes, by address.
    pages: Vec<(u64, Vec<u8>)>,
    /// The libraries' writable bytes, by device.
    libs: Vec<(usize, Vec<(usize, Vec<u8>)>)>,
}

impl Vm {
    /// Make this VM reusable: its run loop returns at the guest's first
    /// ready call ([`Stop::Ready`]) and, once [`Vm::keep_ready_point`] was
    /// called there, at each exit of the guest ([`Stop::Ended`]).
    pub fn set_reusable(&mut self) {
        self.set_reusable_copying(COPY_ALL_PAGES);
    }

    /// [`Vm::set_reusable`], with ready points of at most `pages` pages that
    /// hold anything put back whole (0: always from the dirty log).
    pub fn set_reusable_copying(&mut self, pages: usize) {
        self.reuse = Some(Box::new(Reuse { point: None, stop: None, runs: 0, copy_all: pages }));
    }

    /// Why the last run returned, for a reusable VM that stopped at its
    /// ready point or at the end of a run (`None`: it ended for good, or
    /// is not reusable).
    pub fn reuse_stop(&self) -> Option<Stop> {
        self.reuse.as_ref().and_then(|r| r.stop)
    }

    /// Whether the guest's ready call stops the run loop here.
    pub(super) fn stops_at_ready(&mut self) -> bool {
        match self.reuse.as_mut() {
            Some(r) if r.point.is_none() => {
                r.stop = Some(Stop::Ready);
                true
            }
            _ => false,
        }
    }

    /// Whether the guest's exit with `code` ends a run of a reusable VM
    /// (the VM lives on).
    pub(super) fn run_ends(&mut self, code: i32) -> bool {
        match self.reuse.as_mut() {
            Some(r) if r.point.is_some() => {
                r.stop = Some(Stop::Ended(code));
                true
            }
            _ => false,
        }
    }

    /// At [`Stop::Ready`]: keep the ready point (registers after the ready
    /// call, the pages that hold anything, the libraries' writable bytes)
    /// and start logging the pages the guest writes.
    pub fn keep_ready_point(&mut self) -> Result<()> {
        if self.reuse_stop() != Some(Stop::Ready) {
            return Err(Error::Unsupported("the VM is not at its ready point".into()));
        }
        let vcpu = state::save_vcpu(&mut self.shell.vcpu, self.shell.sync_regs)?;
        let mut scratch = Vec::new();
        let runs = self.shell.ram.resident(u64::MAX, &mut scratch)?.unwrap_or_default();
        let mut pages = Vec::with_capacity(runs.len());
        for (gpa, len) in runs {
            let mut b = vec![0u8; len as usize];
            self.shell.ram.read(gpa, &mut b)?;
            pages.push((gpa, b));
        }
        let libs = self.devices.library_data();
        let held: usize = pages.iter().map(|(_, b)| b.len()).sum::<usize>() / PAGE_SIZE as usize;
        let logged = held > self.reuse.as_ref().map_or(COPY_ALL_PAGES, |r| r.copy_all);
        if logged {
            // The log starts (or is cleared) here, and so does the monitor's.
            let mut written = self.shell.dirty_pages()?;
            self.shell.ram.take_written(&mut written);
        }
        let r = self.reuse.as_mut().expect("checked above");
        r.point = Some(Point { logged, vcpu, pages, libs });
        r.stop = None;
        Ok(())
    }

    /// Before a run: `argv` (the image's name first) into the boot-info
    /// page, where the guest reads it after its ready call.
    pub fn set_run_args(&mut self, argv: &[&str]) -> Result<()> {
        if self.reuse.as_ref().is_none_or(|r| r.point.is_none() || r.stop.is_some()) {
            return Err(Error::Unsupported("the VM is not waiting at its ready point".into()));
        }
        // Only the argument fields are written (the rest of the page is the
        // ready point's): they are laid out as `BootInfo::set_args` lays them.
        let mut info = BootInfo::new();
        info.set_args(argv.iter().copied()).map_err(|n| if n == usize::MAX { Error::ArgNul } else { Error::ArgsTooLong(n) })?;
        let at = |off: usize| BOOT_INFO + off as u64;
        self.shell.ram.write(at(std::mem::offset_of!(BootInfo, argc)), &info.argc.to_le_bytes())?;
        self.shell.ram.write(at(std::mem::offset_of!(BootInfo, args_len)), &info.args_len.to_le_bytes())?;
        self.shell.ram.write(at(std::mem::offset_of!(BootInfo, args)), &info.args[..info.args_len as usize])
    }

    /// At [`Stop::Ended`]: scrub the VM back to its ready point (the
    /// module says what that takes). Returns the pages put back.
    pub fn scrub(&mut self) -> Result<u64> {
        if !matches!(self.reuse_stop(), Some(Stop::Ended(_))) {
            return Err(Error::Unsupported("no run of this VM has ended".into()));
        }
        let point = self.reuse.as_mut().and_then(|r| r.point.take()).expect("a run ended after the ready point");
        let r = self.scrub_to(&point);
        let reuse = self.reuse.as_mut().expect("reusable");
        reuse.point = Some(point);
        if r.is_ok() {
            reuse.stop = None;
            reuse.runs += 1;
        }
        r
    }

    fn scrub_to(&mut self, point: &Point) -> Result<u64> {
        // The exit's `out` is finished before the registers change.
        state::complete_exit(&mut self.shell.vcpu)?;
        let zeros = vec![0u8; PAGE_SIZE as usize];
        let mut put = 0;
        if point.logged {
            let mut written = self.shell.dirty_pages()?;
            self.shell.ram.take_written(&mut written);
            for (i, &w) in written.iter().enumerate() {
                let mut w = w;
                while w != 0 {
                    let gpa = (i as u64 * 64 + w.trailing_zeros() as u64) * PAGE_SIZE;
                    w &= w - 1;
                    self.shell.ram.write(gpa, ready_bytes(&point.pages, gpa).unwrap_or(&zeros))?;
                    put += 1;
                }
            }
            // Those writes were the monitor's: not the next run's to scrub.
            self.shell.ram.take_written(&mut written);
        } else {
            // Pages that have come to hold anything since: zeros.
            let mut scratch = Vec::new();
            for (gpa, len) in self.shell.ram.resident(u64::MAX, &mut scratch)?.unwrap_or_default() {
                for gpa in (gpa..gpa + len).step_by(PAGE_SIZE as usize) {
                    if ready_bytes(&point.pages, gpa).is_none() {
                        self.shell.ram.write(gpa, &zeros)?;
                        put += 1;
                    }
                }
            }
            for (gpa, bytes) in &point.pages {
                self.shell.ram.write(*gpa, bytes)?;
                put += bytes.len() as u64 / PAGE_SIZE;
            }
        }
        self.devices.put_library_data(&point.libs);
        let v = &point.vcpu;
        let vcpu = &self.shell.vcpu;
        // The special registers are the monitor's (the guest at CPL 3
        // cannot change them): set only if they differ, since setting
        // them drops KVM's translations of the guest's pages (every page
        // would fault again in the next run).
        if vcpu.get_sregs().map_err(|e| Error::Kvm("get sregs", e.into()))? != v.sregs {
            vcpu.set_sregs(&v.sregs).map_err(|e| Error::Kvm("set sregs", e.into()))?;
        }
        vcpu.set_regs(&v.regs).map_err(|e| Error::Kvm("set registers", e.into()))?;
        vcpu.set_fpu(&v.fpu).map_err(|e| Error::Kvm("set FPU", e.into()))?;
        self.control.clear_for_reuse();
        Ok(put)
    }

    /// Runs of this VM scrubbed so far.
    pub fn reuses(&self) -> u64 {
        self.reuse.as_ref().map_or(0, |r| r.runs)
    }
}

/// The ready point's bytes of page `gpa`, if it held anything.
fn ready_bytes(pages: &[(u64, Vec<u8>)], gpa: u64) -> Option<&[u8]> {
    let i = pages.partition_point(|(a, _)| *a <= gpa).checked_sub(1)?;
    let (a, b) = &pages[i];
    let off = (gpa - a) as usize;
    b.get(off..off + PAGE_SIZE as usize)
}

#[cfg(test)]
mod tests {
    use super::ready_bytes;

    #[test]
    fn a_page_is_found_in_its_run_or_not_at_all() {
        let pages = vec![(0x1000, vec![1u8; 0x2000]), (0x8000, vec![2u8; 0x1000])];
        assert_eq!(ready_bytes(&pages, 0x2000).map(|b| b[0]), Some(1));
        assert_eq!(ready_bytes(&pages, 0x8000).map(|b| (b[0], b.len())), Some((2, 0x1000)));
        assert!(ready_bytes(&pages, 0x0).is_none());
        assert!(ready_bytes(&pages, 0x3000).is_none());
        assert!(ready_bytes(&pages, 0x9000).is_none());
    }
}
