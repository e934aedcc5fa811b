//! The VMM process: what runs one VM on the monitor (`wisp-vmm`), in the
//! two ways wisp runs one.
//!
//! - Under the daemon, one jailed process per VM (`wispd __worker`,
//!   [`main`]): it prepares a shell for the pool, serves its control socket
//!   ([`proto`], the daemon being the client), boots on `start`, keeps the
//!   console in a ring (streamed to an attached client), writes `exit.json`
//!   and `console.log` when the guest ends, and turns a forked copy of
//!   itself into a VM of the toolstack (fork adoption through the family's
//!   uplink).
//! - `wisp run` without a daemon boots the VM in its own process with the
//!   same boot path ([`boot`], [`images`], [`nic`]) and exit statuses
//!   ([`exit`]).
//!
//! Rooms: [`boot`] (prepare and execute), [`exit`] (outcome → exit status),
//! [`images`] (finding images), [`nic`] (NICs and their MAC rule), [`proto`]
//! (the daemon ↔ VMM-process protocol), [`units`] (sizes and pool targets on command lines);
//! and for the daemon's VMM process `process` (its life), `control` (the
//! control socket), [`group`] (a process holding many VMs), `console` (the console ring), `sink` (the vCPU
//! thread's console: ring and attached stream), `fork` (fork adoption) and
//! `state` (what its threads share). The sandbox is the `wisp-jail` crate.

#![forbid(unsafe_code)]

pub mod boot;
mod console;
mod endpoint;
mod control;
pub mod exit;
mod fork;
pub mod group;
mod hosting;
mod narrow;
pub mod images;
pub mod nic;
mod process;
mod recycle;
pub mod proto;
mod sink;
mod state;
pub mod terminal;
pub mod units;
mod uplink;

pub use console::CONSOLE_RING;
pub use process::main;

/// The host's monotonic clock in ns (`CLOCK_MONOTONIC`: the same clock in
/// every process of the host, so the daemon, a VMM process and a client
/// can time one request's hops against each other).
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}
