//! What the daemon as a whole admits (most VMs, most guest memory, which
//! a create or a fork over them is refused) and what each family may use
//! (its control group's limits, from the create request or by default).
//!
//! Admission is counted under the table's lock: VMs that run (created or
//! forked, not exited) plus creates in progress, which hold their share
//! from the check until their VM is in the table or the create failed.

use wisp_api::{CreateVm, VmLimits, MAX_FAMILY};

use super::error::ActionError;
use super::table::Table;
use crate::cgroup::{Limits, CPU_PERIOD_US};

/// Memory a VM needs besides its guest RAM: its VMM process (about 1.2 MiB
/// measured for an idle VM: monitor heap and stacks, page tables, KVM's
/// structures), its console ring and NIC rings, with room to spare. A
/// family's default memory limit gives each of its VMs this much on top of
/// its RAM, and a limit below one VM's RAM plus this is refused.
pub const MONITOR_MEMORY: u64 = 4 << 20;

/// Tasks a family may have per VM it may hold: a VMM process has 3 or 4
/// threads (vCPU, control, family reaper, NIC I/O) and one per console
/// stream it serves.
pub const TASKS_PER_VM: u64 = 16;

/// Daemon-wide quotas.
#[derive(Clone, Copy, Debug)]
pub struct Quotas {
    /// Most VMs running at once (created and forked).
    pub max_vms: usize,
    /// Most guest RAM of running VMs together, in bytes.
    pub max_guest_memory: u64,
}

/// What a family of VMs of `mem` bytes may use: `family_limit` VMs (default
/// [`MAX_FAMILY`]) and their monitors, unless `memory` says otherwise; a
/// CPU quota only if `cpus` asks for one.
pub fn family_limits(mem: u64, memory: Option<u64>, cpus: Option<f64>, family_limit: Option<u32>) -> Limits {
    let n = u64::from(family_limit.unwrap_or(MAX_FAMILY));
    Limits {
        memory: memory.unwrap_or_else(|| n.saturating_mul(mem.saturating_add(MONITOR_MEMORY))),
        pids: n * TASKS_PER_VM,
        cpu_quota_us: cpus.map(|c| ((c * CPU_PERIOD_US as f64).round() as u64).max(1000)),
    }
}

/// The limits of a create request for a VM of `mem` bytes, checked against
/// the host (`host_cpus`).
pub fn request_limits(req: &CreateVm, mem: u64, host_cpus: usize) -> Result<Limits, ActionError> {
    wisp_api::action::check_limits(req)?;
    if let Some(c) = req.cpus {
        if c > host_cpus as f64 {
            return Err(ActionError::TooManyCpus { asked: c, host: host_cpus });
        }
    }
    let min = mem + MONITOR_MEMORY;
    if let Some(m) = req.memory.filter(|m| *m < min) {
        return Err(ActionError::MemoryBelowVm { memory: m, min });
    }
    Ok(family_limits(mem, req.memory, req.cpus, req.family_limit))
}

/// The limits as the API shows them.
pub fn shown(l: &Limits, family_limit: Option<u32>) -> VmLimits {
    VmLimits {
        memory: l.memory,
        cpus: l.cpu_quota_us.map(|q| q as f64 / CPU_PERIOD_US as f64),
        family_limit: family_limit.unwrap_or(MAX_FAMILY),
        pids: l.pids,
    }
}

impl Table {
    /// VMs running (not exited) and their guest RAM, creates in progress
    /// included.
    pub fn load(&self) -> (usize, u64) {
        (self.live.0 + self.pending.0, self.live.1.saturating_add(self.pending.1))
    }

    /// Whether one more VM of `mem` bytes fits under `q` (a fork's check).
    pub fn fits(&self, mem: u64, q: &Quotas) -> Result<(), ActionError> {
        let (n, used) = self.load();
        if n >= q.max_vms {
            return Err(ActionError::TooManyVms(q.max_vms));
        }
        if used.saturating_add(mem) > q.max_guest_memory {
            return Err(ActionError::GuestMemory { asked: mem, used, max: q.max_guest_memory });
        }
        Ok(())
    }

    /// Admit a create of a VM of `mem` bytes under `q`: it holds its share
    /// until [`Table::settle`].
    pub fn admit(&mut self, mem: u64, q: &Quotas) -> Result<(), ActionError> {
        self.fits(mem, q)?;
        self.pending = (self.pending.0 + 1, self.pending.1 + mem);
        Ok(())
    }

    /// A create admitted with `mem` bytes is in the table now, or failed.
    pub fn settle(&mut self, mem: u64) {
        self.pending = (self.pending.0.saturating_sub(1), self.pending.1.saturating_sub(mem));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::table::Entry;

    #[test]
    fn the_apis_family_bound_is_the_monitors() {
        assert_eq!(MAX_FAMILY as usize, wisp_abi::family::limits::MAX_MEMBERS);
    }

    #[test]
    fn a_family_gets_room_for_all_its_vms_unless_told_otherwise() {
        let mib = 1 << 20;
        let l = family_limits(16 * mib, None, None, None);
        assert_eq!(l, Limits { memory: 64 * 20 * mib, pids: 64 * TASKS_PER_VM, cpu_quota_us: None });
        let l = family_limits(16 * mib, Some(96 * mib), Some(1.5), Some(4));
        assert_eq!(l, Limits { memory: 96 * mib, pids: 4 * TASKS_PER_VM, cpu_quota_us: Some(150_000) });
        assert_eq!(family_limits(16 * mib, None, Some(0.01), Some(1)).cpu_quota_us, Some(1000), "the kernel's smallest quota is 1 ms");
        assert_eq!(shown(&l, Some(4)), VmLimits { memory: 96 * mib, cpus: Some(1.5), family_limit: 4, pids: 64 });
        let req = |memory, cpus| CreateVm { image: "x".into(), memory, cpus, ..Default::default() };
        assert!(matches!(request_limits(&req(None, Some(3.0)), 16 * mib, 2), Err(ActionError::TooManyCpus { host: 2, .. })));
        assert!(matches!(request_limits(&req(None, Some(0.0)), 16 * mib, 2), Err(ActionError::Limits(_))));
        let low = request_limits(&req(Some(19 * mib), None), 16 * mib, 2).unwrap_err();
        assert_eq!(low.to_string(), "memory limit 19 MiB is below one VM of this size and its monitor (20 MiB)");
        assert_eq!(request_limits(&req(Some(20 * mib), Some(2.0)), 16 * mib, 2).unwrap().memory, 20 * mib);
    }

    #[test]
    fn admission_counts_running_vms_and_creates_in_progress() {
        use wisp_api::VmState;
        let q = Quotas { max_vms: 2, max_guest_memory: 64 << 20 };
        let mut t = Table::default();
        t.admit(32 << 20, &q).unwrap();
        assert_eq!(t.load(), (1, 32 << 20));
        // Over the memory, then over the count.
        assert!(matches!(t.admit(48 << 20, &q), Err(ActionError::GuestMemory { used, .. }) if used == 32 << 20));
        t.admit(16 << 20, &q).unwrap();
        assert!(matches!(t.fits(4 << 20, &q), Err(ActionError::TooManyVms(2))));
        // A create that failed gives its share back; an exited VM holds none.
        t.settle(16 << 20);
        let mut e = Entry::new(crate::daemon::table::tests::info("abc000000000"), "/nonexistent".into(), None, None);
        e.info.mem = 32 << 20;
        e.info.state = VmState::Exited;
        t.insert(e);
        assert_eq!(t.load(), (1, 32 << 20));
        t.fits(32 << 20, &q).unwrap();
        assert_eq!(t.load(), (1, 32 << 20), "a fork's check holds no share");
    }
}
