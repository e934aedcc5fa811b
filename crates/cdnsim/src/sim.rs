//! The simulation: viewers arrive, watch a channel for their session and
//! leave; a cache per (access AS, channel) is started by the first viewer
//! of that channel there, serves after the boot time, and stops after an
//! idle timeout. Until a viewer's cache is up it streams from the origin
//! over the valley-free path to its access AS, sharing links max-min
//! fairly with the other streams from the origin and the caches' feeds
//! (each cache pulls its channel from the origin: the non-cooperative
//! mode; the cooperative one is still to come); once the cache is up its
//! viewers move to it and cross no inter-AS link. Each viewer's playback
//! buffer turns its rates into QoE (`player`). Every flow is its own entry
//! in the max-min solver so far: correct, and the reference for the
//! faster classes of flows still to come.
//!
//! Events (arrival, departure, a cache up or stopping, a viewer's buffer
//! changing state) are taken in time order from a heap; a viewer's
//! planned buffer event is dropped when its plan changes (a version per
//! viewer). After each event the flows it touched are made max-min fair
//! again (`maxmin`), and every viewer whose rate moved is re-planned.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::maxmin::{FlowId, MaxMin};
use crate::player::{Player, Qoe};
use crate::routing::Routes;
use crate::topology::{Role, Topology};
use crate::workload::{self, Params, Viewer};

/// How a run is set up besides its viewers.
#[derive(Clone, Debug)]
pub struct Config {
    /// Seconds from a cache's start until it serves.
    pub boot_s: f64,
    /// Seconds a cache with no viewer stays up.
    pub idle_s: f64,
    /// A viewer's line (bits/s).
    pub line_bps: f64,
    /// A cache's feed of its channel (bits/s).
    pub feed_bps: f64,
    /// Seconds of video buffered before playback starts (and resumes).
    pub start_s: f64,
    /// Seconds of video a live stream can be buffered ahead.
    pub edge_s: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config { boot_s: 1.0, idle_s: 60.0, line_bps: 25e6, feed_bps: 20e6, start_s: 2.0, edge_s: 10.0 }
    }
}

/// A run's results.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Per viewer, in arrival order.
    pub qoe: Vec<Qoe>,
    /// Events taken.
    pub events: u64,
    /// (time, caches running) at every change.
    pub caches: Vec<(f64, u32)>,
    /// Most viewers watching at once.
    pub peak_viewers: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Arrive(usize),
    Leave(usize),
    CacheUp(usize),
    CacheStop(usize, u32),
    /// A viewer's buffer, as planned at version `.1`.
    Buffer(usize, u32),
}

/// A time, ordered totally (for the heap).
#[derive(Clone, Copy, PartialEq)]
struct T(f64);

impl Eq for T {}

impl PartialOrd for T {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for T {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

enum CacheState {
    Booting,
    Up,
}

struct Cache {
    access: usize,
    state: CacheState,
    viewers: Vec<usize>,
    feed: Option<FlowId>,
    /// Bumped when a stop is planned or cancelled.
    stop_version: u32,
}

struct Watching {
    player: Player,
    cache: usize,
    /// Its flow from the origin, while its cache boots.
    flow: Option<FlowId>,
    version: u32,
    /// The rate its plan was made with.
    planned_rate: f64,
}

/// Run `viewers` (drawn for the access ASes of `t`) on `t` from the
/// content AS `origin`.
pub fn run(t: &Topology, origin: usize, params: &Params, cfg: &Config, seed: u64) -> Result<Outcome, String> {
    let access: Vec<usize> = t.with_role(Role::Access).collect();
    let viewers: Vec<Viewer> = workload::viewers(params, access.len(), seed)?.collect();
    let routes = Routes::from(t, origin);
    let mut paths: Vec<Option<Vec<usize>>> = vec![None; t.ases.len()];
    for &a in &access {
        paths[a] = routes.path(a);
    }
    let mut net = MaxMin::new(t.links.iter().map(|l| l.capacity_bps).collect());
    let mut heap: BinaryHeap<Reverse<(T, Ev)>> = BinaryHeap::new();
    for (i, v) in viewers.iter().enumerate() {
        heap.push(Reverse((T(v.arrive), Ev::Arrive(i))));
    }
    let mut caches: Vec<Cache> = Vec::new();
    let mut cache_of: HashMap<(usize, u32), usize> = HashMap::new();
    let mut watching: HashMap<usize, Watching> = HashMap::new();
    let mut flow_owner: HashMap<FlowId, usize> = HashMap::new();
    let mut out = Outcome { qoe: vec![Qoe { startup_delay_s: 0.0, buffering_ratio: 0.0, buffering_events: 0, playback_ratio: 0.0, started: false }; viewers.len()], ..Outcome::default() };
    let mut running = 0u32;
    while let Some(Reverse((T(now), ev))) = heap.pop() {
        out.events += 1;
        match ev {
            Ev::Arrive(i) => {
                let v = &viewers[i];
                let as_idx = access[v.access];
                heap.push(Reverse((T(now + v.session_s), Ev::Leave(i))));
                let c = *cache_of.entry((as_idx, v.channel)).or_insert_with(|| {
                    caches.push(Cache { access: as_idx, state: CacheState::Booting, viewers: Vec::new(), feed: None, stop_version: 0 });
                    caches.len() - 1
                });
                if caches[c].viewers.is_empty() && caches[c].feed.is_none() && matches!(caches[c].state, CacheState::Booting) {
                    // A cache to start (or one stopped before): boot it.
                    start_cache(&mut caches[c], c, now, cfg, &mut heap, &mut net, &paths, &mut running, &mut out);
                }
                caches[c].viewers.push(i);
                caches[c].stop_version += 1;
                let mut w = Watching { player: Player::new(now, v.bitrate, cfg.line_bps, cfg.start_s, cfg.edge_s), cache: c, flow: None, version: 0, planned_rate: 0.0 };
                match caches[c].state {
                    CacheState::Up => w.player.set_rate(now, w.player.demand()),
                    CacheState::Booting => match &paths[as_idx] {
                        Some(p) => {
                            let f = net.add(p.clone(), w.player.demand());
                            flow_owner.insert(f, i);
                            w.flow = Some(f);
                        }
                        None => w.player.set_rate(now, 0.0),
                    },
                }
                watching.insert(i, w);
                plan(i, watching.get_mut(&i).expect("just put"), now, &mut heap);
                out.peak_viewers = out.peak_viewers.max(watching.len());
            }
            Ev::Leave(i) => {
                let Some(mut w) = watching.remove(&i) else { continue };
                out.qoe[i] = w.player.finish(now);
                if let Some(f) = w.flow.take() {
                    net.remove(f);
                    flow_owner.remove(&f);
                }
                let c = &mut caches[w.cache];
                c.viewers.retain(|&x| x != i);
                if c.viewers.is_empty() {
                    c.stop_version += 1;
                    heap.push(Reverse((T(now + cfg.idle_s), Ev::CacheStop(w.cache, c.stop_version))));
                }
            }
            Ev::CacheUp(c) => {
                caches[c].state = CacheState::Up;
                for &i in &caches[c].viewers {
                    let w = watching.get_mut(&i).expect("a cache's viewers watch");
                    if let Some(f) = w.flow.take() {
                        net.remove(f);
                        flow_owner.remove(&f);
                    }
                    let d = w.player.demand();
                    w.player.set_rate(now, d);
                    plan(i, w, now, &mut heap);
                }
            }
            Ev::CacheStop(c, version) => {
                let cache = &mut caches[c];
                if cache.stop_version != version || !cache.viewers.is_empty() {
                    continue;
                }
                if let Some(f) = cache.feed.take() {
                    net.remove(f);
                }
                cache.state = CacheState::Booting;
                running -= 1;
                out.caches.push((now, running));
            }
            Ev::Buffer(i, version) => {
                let Some(w) = watching.get_mut(&i) else { continue };
                if w.version != version {
                    continue;
                }
                w.player.advance(now);
                let d = w.player.demand();
                match w.flow {
                    // (The solve below gives it its new rate.)
                    Some(f) => net.set_demand(f, d),
                    // Served by its cache or unreachable: its line or nothing.
                    None if w.player.rate() > 0.0 => w.player.set_rate(now, d),
                    None => {}
                }
                plan(i, w, now, &mut heap);
            }
        }
        net.solve(|f, r| {
            if let Some(&i) = flow_owner.get(&f) {
                let w = watching.get_mut(&i).expect("flows belong to watching viewers");
                w.player.set_rate(now, r);
                if (r - w.planned_rate).abs() > 0.01 * w.planned_rate.max(1.0) || r == 0.0 {
                    plan(i, w, now, &mut heap);
                }
            }
        });
    }
    Ok(out)
}

/// Plan viewer `i`'s next buffer event under its current rate.
fn plan(i: usize, w: &mut Watching, _now: f64, heap: &mut BinaryHeap<Reverse<(T, Ev)>>) {
    w.version += 1;
    w.planned_rate = w.player.rate();
    if let Some(at) = w.player.next_event() {
        heap.push(Reverse((T(at), Ev::Buffer(i, w.version))));
    }
}

#[allow(clippy::too_many_arguments)]
fn start_cache(
    c: &mut Cache,
    id: usize,
    now: f64,
    cfg: &Config,
    heap: &mut BinaryHeap<Reverse<(T, Ev)>>,
    net: &mut MaxMin,
    paths: &[Option<Vec<usize>>],
    running: &mut u32,
    out: &mut Outcome,
) {
    if let Some(p) = &paths[c.access] {
        c.feed = Some(net.add(p.clone(), cfg.feed_bps));
    }
    *running += 1;
    out.caches.push((now, *running));
    heap.push(Reverse((T(now + cfg.boot_s), Ev::CacheUp(id))));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Speeds;

    /// An origin (content AS 10) behind one transit AS (1) over a thin
    /// link, and three access ASes below the transit AS.
    fn small(origin_bps: f64) -> (Topology, usize) {
        let text = "# role 10 content\n1|10|-1\n1|2|-1\n1|3|-1\n1|4|-1\n";
        let mut t = Topology::parse(text, Speeds::default()).unwrap();
        let o = t.find(10).unwrap();
        for l in t.links.iter_mut().filter(|l| l.a == o || l.b == o) {
            l.capacity_bps = origin_bps;
        }
        (t, o)
    }

    fn params(viewers: usize) -> Params {
        Params { viewers, channels: 20, concurrency: 300.0, session: (60.0, 90.0, 120.0), ..Params::default() }
    }

    fn mean(q: &[Qoe], f: impl Fn(&Qoe) -> f64) -> f64 {
        q.iter().map(f).sum::<f64>() / q.len() as f64
    }

    #[test]
    fn slower_caches_mean_a_worse_start_when_the_origin_is_congested() {
        // Few viewers a channel and caches that stop after a second alone:
        // most viewers find their cache stopped and wait for one to boot,
        // streaming meanwhile from an origin behind 60 Mb/s (which the
        // caches' feeds share).
        let (t, o) = small(60e6);
        let p = Params { concurrency: 40.0, ..params(3000) };
        let fast = run(&t, o, &p, &Config { boot_s: 0.0, idle_s: 1.0, ..Config::default() }, 1).unwrap();
        let slow = run(&t, o, &p, &Config { boot_s: 10.0, idle_s: 1.0, ..Config::default() }, 1).unwrap();
        assert_eq!(fast.qoe.len(), 3000);
        let (sf, ss) = (mean(&fast.qoe, |q| q.startup_delay_s), mean(&slow.qoe, |q| q.startup_delay_s));
        assert!(ss > 2.0 * sf, "start-up {sf} s with instant caches, {ss} s with 10 s boots");
        let (bf, bs) = (mean(&fast.qoe, |q| q.buffering_ratio), mean(&slow.qoe, |q| q.buffering_ratio));
        assert!(bs >= bf, "buffering {bf} against {bs}");
        // With instant caches the start is the line's: 2 s of video at
        // 25 Mb/s, 0.08-1.6 s by bitrate.
        assert!(fast.qoe.iter().all(|q| q.started && q.startup_delay_s <= 1.6 + 1e-6), "{:?}", fast.qoe.iter().map(|q| q.startup_delay_s).fold(0.0, f64::max));
        assert!(fast.peak_viewers > 20 && fast.caches.iter().map(|c| c.1).max().unwrap() <= 60);
    }

    #[test]
    fn a_seed_gives_the_same_run() {
        let (t, o) = small(200e6);
        let a = run(&t, o, &params(500), &Config::default(), 4).unwrap();
        let b = run(&t, o, &params(500), &Config::default(), 4).unwrap();
        assert_eq!(a.qoe, b.qoe);
        assert_eq!((a.events, a.caches.len()), (b.events, b.caches.len()));
    }
}
