//! Timings of a VM's setup and run, reported by `wisp run --stats`.

use std::time::Instant;

/// Named phases in microseconds, in the order they happened, and counters.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// (phase, microseconds).
    pub phases: Vec<(&'static str, f64)>,
    /// KVM_RUN returns (exits to the monitor).
    pub exits: u64,
    /// Hypercalls served.
    pub hypercalls: u64,
    /// Forks handed to a spare monitor process (`vm/spare.rs`).
    pub forks_prepared: u64,
    /// Of those, forks handed to a spare that had served an earlier fork
    /// (its child's guest ended and it came back: `vm/spare.rs`).
    pub forks_recycled: u64,
}

impl Stats {
    /// Record a phase that started at `since` and ends now.
    pub fn phase(&mut self, name: &'static str, since: Instant) {
        self.add(name, since.elapsed().as_secs_f64() * 1e6);
    }

    /// Add microseconds to a phase (creating it if new).
    pub fn add(&mut self, name: &'static str, us: f64) {
        match self.phases.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => *v += us,
            None => self.phases.push((name, us)),
        }
    }

    /// Microseconds spent in a phase.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.phases.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    /// JSON object of the phases: `{"name": us, ...}`.
    pub fn phases_json(&self) -> String {
        let items: Vec<String> = self.phases.iter().map(|(n, v)| format!("\"{n}\":{v:.1}")).collect();
        format!("{{{}}}", items.join(","))
    }
}
