//! A run's summary: QoE means and percentiles, the run's size and speed
//! (JSON, with serde_json).

use serde_json::{json, Value};

use crate::player::Qoe;
use crate::sim::Outcome;

/// The `q`-quantile of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Mean and percentiles of one QoE field over the viewers.
fn spread(qoe: &[Qoe], f: impl Fn(&Qoe) -> f64) -> Value {
    let mut v: Vec<f64> = qoe.iter().map(f).collect();
    v.sort_by(f64::total_cmp);
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    json!({"mean": mean, "p50": quantile(&v, 0.5), "p90": quantile(&v, 0.9), "p99": quantile(&v, 0.99)})
}

/// Mean and percentiles of `v`.
fn spread_of(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    json!({"mean": mean, "p50": quantile(&v, 0.5), "p90": quantile(&v, 0.9), "p99": quantile(&v, 0.99), "max": v.last().copied().unwrap_or(0.0)})
}

/// The summary of `r` (its run took `wall` seconds).
pub fn summary(r: &Outcome, wall: f64, boot_s: f64, seed: u64) -> Value {
    json!({
        "viewers": r.qoe.len(),
        "boot_time_s": boot_s,
        "seed": seed,
        "wall_s": wall,
        "events": r.events,
        "events_per_s": r.events as f64 / wall.max(1e-9),
        "peak_viewers": r.peak_viewers,
        "peak_caches": r.caches.iter().map(|c| c.1).max().unwrap_or(0),
        "feeds_from_origin": r.feeds_from_origin,
        "feeds_from_caches": r.feeds_from_caches,
        "startup_delay_s": spread(&r.qoe, |q| q.startup_delay_s),
        "buffering_ratio": spread(&r.qoe, |q| q.buffering_ratio),
        "buffering_events": spread(&r.qoe, |q| q.buffering_events as f64),
        "playback_ratio": spread(&r.qoe, |q| q.playback_ratio),
        "never_started": r.qoe.iter().filter(|q| !q.started).count(),
        "per_cache_peak_connections": spread_of(r.per_cache.iter().map(|c| c.0 as f64).collect()),
        "per_cache_peak_mbps": spread_of(r.per_cache.iter().map(|c| c.1 / 1e6).collect()),
        "per_as_peak_connections": spread_of(r.per_as.iter().map(|a| a.0 as f64).collect()),
        "per_as_peak_gbps": spread_of(r.per_as.iter().map(|a| a.1 / 1e9).collect()),
        "per_as_peak_caches": spread_of(r.per_as.iter().map(|a| a.2 as f64).collect()),
    })
}
