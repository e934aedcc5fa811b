//! `GET /metrics`: what the daemon knows, in Prometheus' text format
//! (`crate::metrics` writes it; `docs/toolstack.md`, "Metrics", lists
//! every metric). The table, records, pool and groups are copied under
//! their locks first; `/proc` is read afterwards, with no lock held: one
//! `/proc/<pid>/stat` per VMM process (CPU time, resident memory, start
//! time) and `/proc/self/net/dev` once for every tap.
//!
//! The boot histogram measures, on the daemon's own clock, from a create
//! request's arrival at the daemon (its first byte, `arrived`: what
//! `boot_trace.arrived_ns` shows) to the daemon reading the VMM process's
//! answer that the start succeeded, which the VMM process sends once the
//! guest has run, at its first exit (within 10 ms: `docs/toolstack.md`,
//! "Execute"). It is observed in `create.rs` for every start that
//! succeeds: images, restores, templates' VMs, migrations' destinations,
//! just-in-time VMs (not forks, which are no boot). The readings a VMM
//! process reports (`boot_us`, `boot_trace.entered_ns`) are its word,
//! shown by the API, not used here.

use std::collections::{BTreeMap, BTreeSet};

use wisp_api::VmState;

use super::Daemon;
use crate::metrics::{Kind, Text};
use crate::procfs::{self, Usage};

/// Upper bounds of the boot histogram's buckets, in seconds: a warm start
/// takes well under a millisecond to a few here, an attached one up to
/// 10 ms more (the guest's first exit), a cold one (a shell prepared on
/// the spot) tens of milliseconds; seconds are a host in trouble.
pub(super) const BOOT_BUCKETS: [f64; 14] = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// A NIC's metric: its name, its help, and which of the tap's counters it is.
type NicFamily = (&'static str, &'static str, fn(&procfs::NetDev) -> u64);

/// A VM as a scrape sees it, copied out of the table.
struct Seen {
    id: String,
    name: String,
    /// Its VMM process, if it is its own (not a group's) and has not ended.
    pid: Option<u32>,
    /// It has a NIC (its tap: `net::tap_name`), and has not ended.
    nic: bool,
}

/// The API's name of a state.
fn state_name(s: VmState) -> &'static str {
    match s {
        VmState::Running => "running",
        VmState::Paused => "paused",
        VmState::Exited => "exited",
    }
}

impl Daemon {
    /// The text of one scrape.
    pub(super) fn metrics(&self) -> String {
        let mut states: BTreeMap<&str, u64> = [VmState::Running, VmState::Paused, VmState::Exited].map(|s| (state_name(s), 0)).into();
        let mut vms: Vec<Seen> = Vec::new();
        {
            let t = self.vms.lock();
            for e in t.shown() {
                *states.entry(state_name(e.info.state)).or_default() += 1;
                let live = e.info.state != VmState::Exited;
                let pid = (live && e.info.group.is_none() && e.info.pid != 0).then_some(e.info.pid);
                let name = e.info.name.clone().unwrap_or_default();
                vms.push(Seen { id: e.info.id.clone(), name, pid, nic: live && e.info.ip.is_some() });
            }
        }
        vms.sort_by(|a, b| a.id.cmp(&b.id));
        // A pid whose process started at another time than its record says
        // is no longer the VM's (it ended, and the pid was given again).
        let starts: Vec<Option<u64>> = self.records.procs_of(vms.iter().map(|v| v.id.as_str())).into_iter().map(|p| p.and_then(|p| p.start)).collect();
        let pool = wisp_api::PoolInfo { group_spares: self.groups.spares(), ..self.pool.info() };
        let mut groups = self.groups.census();
        groups.sort_by(|a, b| a.id.cmp(&b.id));
        let recyclers = self.recyclers.count();
        let boots = self.boot_seconds.snapshot();

        // The reads, no lock held.
        let usage = |pid: u32, start: Option<u64>| procfs::usage(pid).filter(|u| start.is_none_or(|s| s == u.start));
        let vm_usage: Vec<Option<Usage>> = vms.iter().zip(&starts).map(|(v, s)| v.pid.and_then(|p| usage(p, *s))).collect();
        let group_usage: Vec<Option<Usage>> = groups.iter().map(|g| (g.pid != 0).then(|| usage(g.pid, g.start)).flatten()).collect();
        let devs = if vms.iter().any(|v| v.nic) { procfs::net_devs() } else { Default::default() };
        let (hz, page) = (procfs::ticks_per_second() as f64, procfs::page_size());

        let mut t = Text::default();
        t.family("wisp_vms", Kind::Gauge, "VMs the daemon lists, by state (an exited VM is listed until it is removed).");
        for (state, n) in &states {
            t.int(&[("state", state)], *n);
        }
        t.family("wisp_boots_total", Kind::Counter, "VMs started by this daemon since it started: creates of an image, restores, VMs from templates (not forks).");
        t.int(&[], boots.count());
        t.family(
            "wisp_boot_seconds",
            Kind::Histogram,
            "Boot latency in seconds, on the daemon's clock: from a create request's arrival at the daemon to the VMM process's answer that the guest has run.",
        );
        t.histogram(&[], &boots);

        let mems: BTreeSet<u64> = pool.target.iter().chain(&pool.ready).map(|p| p.mem).collect();
        let mem_label = |mem: u64| mem.to_string();
        t.family("wisp_pool_target_shells", Kind::Gauge, "Ready shells the pool keeps, per guest memory size in bytes (wispd --pool, PUT /v1/pool).");
        for p in &pool.target {
            t.int(&[("mem_bytes", &mem_label(p.mem))], p.count.into());
        }
        t.family("wisp_pool_ready_shells", Kind::Gauge, "Ready shells in the pool now, per guest memory size in bytes.");
        for mem in &mems {
            let n = pool.ready.iter().find(|p| p.mem == *mem).map_or(0, |p| p.count);
            t.int(&[("mem_bytes", &mem_label(*mem))], n.into());
        }
        t.family("wisp_pool_preloaded_shells", Kind::Gauge, "Ready shells holding an image loaded ahead, per guest memory size in bytes and image.");
        for l in &pool.loaded {
            t.int(&[("mem_bytes", &mem_label(l.mem)), ("image", &l.image)], l.count.into());
        }
        t.family("wisp_pool_group_spares", Kind::Gauge, "Group VMM processes (wispd --vms-per-process) whose next VM is prepared.");
        t.int(&[], pool.group_spares.into());
        let kind = |recycle: bool| if recycle { "recycling" } else { "shared" };
        t.family("wisp_group_places", Kind::Gauge, "Places of a group VMM process: the most VMs it hosts.");
        for g in &groups {
            t.int(&[("group", &g.id), ("kind", kind(g.recycle))], g.hosts.into());
        }
        t.family("wisp_group_places_taken", Kind::Gauge, "Places of a group VMM process taken: its VMs, recycler endpoints and creates under way.");
        for g in &groups {
            t.int(&[("group", &g.id), ("kind", kind(g.recycle))], g.members as u64);
        }
        t.family("wisp_recycler_endpoints", Kind::Gauge, "Recycler endpoints (POST /v1/recyclers).");
        t.int(&[], recyclers as u64);

        t.family(
            "wisp_vm_cpu_seconds_total",
            Kind::Counter,
            "CPU time (user and system) of the VM's own VMM process, its vCPU included, in seconds (VMs of a group VMM process: wisp_group_cpu_seconds_total).",
        );
        for (v, u) in vms.iter().zip(&vm_usage) {
            if let Some(u) = u {
                t.sample(&[("vm", &v.id), ("name", &v.name)], u.cpu_ticks as f64 / hz);
            }
        }
        t.family(
            "wisp_vm_resident_memory_bytes",
            Kind::Gauge,
            "Resident memory of the VM's own VMM process in bytes: guest RAM touched and the monitor; pages shared with other VMs (an image's, a family's copy-on-write pages) count in each.",
        );
        for (v, u) in vms.iter().zip(&vm_usage) {
            if let Some(u) = u {
                t.int(&[("vm", &v.id), ("name", &v.name)], u.rss_pages * page);
            }
        }
        t.family("wisp_group_cpu_seconds_total", Kind::Counter, "CPU time (user and system) of a group VMM process, every VM it hosts together, in seconds.");
        for (g, u) in groups.iter().zip(&group_usage) {
            if let Some(u) = u {
                t.sample(&[("group", &g.id), ("kind", kind(g.recycle))], u.cpu_ticks as f64 / hz);
            }
        }
        t.family("wisp_group_resident_memory_bytes", Kind::Gauge, "Resident memory of a group VMM process, every VM it hosts together, in bytes.");
        for (g, u) in groups.iter().zip(&group_usage) {
            if let Some(u) = u {
                t.int(&[("group", &g.id), ("kind", kind(g.recycle))], u.rss_pages * page);
            }
        }

        // A tap's transmit is toward the VM: the VM's receive, and the other way.
        let nics: Vec<(&Seen, String, procfs::NetDev)> = vms
            .iter()
            .filter(|v| v.nic)
            .filter_map(|v| {
                let tap = super::net::tap_name(&v.id);
                devs.get(&tap).map(|d| (v, tap, *d))
            })
            .collect();
        let nic_families: [NicFamily; 6] = [
            ("wisp_nic_rx_bytes_total", "Bytes the VM's NIC received (sent toward the VM: its host tap's transmitted bytes).", |d| d.tx_bytes),
            ("wisp_nic_tx_bytes_total", "Bytes the VM's NIC sent (its host tap's received bytes).", |d| d.rx_bytes),
            ("wisp_nic_rx_packets_total", "Frames the VM's NIC received (its host tap's transmitted frames).", |d| d.tx_packets),
            ("wisp_nic_tx_packets_total", "Frames the VM's NIC sent (its host tap's received frames).", |d| d.rx_packets),
            (
                "wisp_nic_rx_dropped_total",
                "Frames toward the VM dropped by the host (its tap's transmit drops: the tap's queue full while the VM did not take them).",
                |d| d.tx_dropped,
            ),
            ("wisp_nic_tx_dropped_total", "Frames from the VM dropped by the host (its tap's receive drops).", |d| d.rx_dropped),
        ];
        for (name, help, value) in nic_families {
            t.family(name, Kind::Counter, help);
            for (v, tap, d) in &nics {
                t.int(&[("vm", &v.id), ("name", &v.name), ("interface", tap)], value(d));
            }
        }
        t.finish()
    }
}
