//! The simulation: viewers arrive, watch a channel for their session and
//! leave; a cache per (access AS, channel) is started by the first viewer
//! of that channel there, serves after the boot time, and stops after an
//! idle timeout. Until a viewer's cache is up it streams from the origin
//! over the valley-free path to its access AS, sharing links max-min
//! fairly with the other streams from the origin and the caches' feeds
//! (each cache pulls its channel from the origin: the non-cooperative
//! mode; the cooperative one is still to come; the feeds to one AS are one
//! class); once the cache is up its
//! viewers move to it and cross no inter-AS link. Each viewer's playback
//! buffer turns its rates into QoE (`player`). The viewers streaming from
//! the origin to one access AS with one demand are one class — one entry
//! of the max-min solver with a count — and a class's rate reaches its
//! viewers' buffers when it has moved by more than [`REPLAN`] since it
//! last did: with a congested link, every arrival moves its share by a
//! fraction of a percent, and telling every viewer each time would make
//! each event cost as many viewers as share the link.
//!
//! Events (arrival, departure, a cache up or stopping, a viewer's buffer
//! changing state) are taken in time order from a heap; a viewer's
//! planned buffer event is dropped when its plan changes (a version per
//! viewer). After each event the flows it touched are made max-min fair
//! again (`maxmin`), and every viewer whose rate moved is re-planned.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The run's maps are keyed by small integers: a fast hash (foldhash), with
/// a fixed seed so that a run repeats.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::FixedState>;

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
    /// A cache pulls its feed from the nearest cache of its channel that
    /// serves (no farther than the origin), else from the origin.
    pub cooperative: bool,
    /// The straightforward way, for comparison: a solver entry per stream
    /// and per feed, every rate filled from scratch after every event and
    /// told to its viewer at once.
    pub naive: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config { boot_s: 1.0, idle_s: 60.0, line_bps: 25e6, feed_bps: 20e6, start_s: 2.0, edge_s: 10.0, cooperative: false, naive: false }
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
    /// Per cache (every one that ran): its most connections at once and
    /// their bitrates together then (bits/s) — the paper's Figure 1(a, b).
    pub per_cache: Vec<(u32, f64)>,
    /// Per access AS with viewers: its most connections at once, the most
    /// bitrate at once (bits/s) and the most caches running at once —
    /// Figure 1(c, d, e).
    pub per_as: Vec<(u32, f64, u32)>,
    /// Caches started with their feed from the origin, and from another
    /// cache (cooperative).
    pub feeds_from_origin: u64,
    pub feeds_from_caches: u64,
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
    /// Its viewers' bitrates together, and its peaks (connections, bits/s).
    bps: f64,
    peak: (u32, f64),
    channel: u32,
    /// The cache its feed comes from (`None`: the origin).
    source: Option<usize>,
    /// Caches fed from this one: it stays up while there are any.
    dependents: u32,
    /// Its feed's class.
    feed_key: Option<usize>,
    state: CacheState,
    viewers: Vec<usize>,
    /// Started and not stopped since.
    running: bool,
    /// Bumped when a stop is planned or cancelled.
    stop_version: u32,
}

/// How far (a fraction) a class's rate moves before its viewers are told.
pub const REPLAN: f64 = 0.01;

/// Viewers streaming from the origin to one access AS, with one demand.
struct Class {
    flow: FlowId,
    members: Vec<usize>,
    /// The rate its viewers were last given.
    applied: f64,
}

/// A class's key: access AS, demand (bits/s, exact).
type Key = (usize, u64);

struct Watching {
    player: Player,
    cache: usize,
    /// Its class, while it streams from the origin.
    class: Option<Key>,
    version: u32,
}

/// Run `viewers` (drawn for the access ASes of `t`) on `t` from the
/// content AS `origin`.
pub fn run(t: &Topology, origin: usize, params: &Params, cfg: &Config, seed: u64) -> Result<Outcome, String> {
    run_with(t, origin, params, cfg, seed, |_| {})
}

/// [`run`], telling `progress` how many viewers have left so far (every
/// 1,000th departure).
pub fn run_with(t: &Topology, origin: usize, params: &Params, cfg: &Config, seed: u64, mut progress: impl FnMut(usize)) -> Result<Outcome, String> {
    let mut left = 0usize;
    let access: Vec<usize> = t.with_role(Role::Access).collect();
    let viewers: Vec<Viewer> = workload::viewers(params, access.len(), seed)?.collect();
    let routes = Routes::from(t, origin);
    let mut paths: Vec<Option<Vec<usize>>> = vec![None; t.ases.len()];
    for &a in &access {
        paths[a] = routes.path(a);
    }
    let mut net = MaxMin::new(t.links.iter().map(|l| l.capacity_bps).collect());
    net.naive = cfg.naive;
    let tolerance = if cfg.naive { 0.0 } else { REPLAN };
    // A class's key: per access AS, or per viewer (naive).
    let group = |i: usize, a: usize| if cfg.naive { usize::MAX - i } else { a };
    let mut heap: BinaryHeap<Reverse<(T, Ev)>> = BinaryHeap::new();
    for (i, v) in viewers.iter().enumerate() {
        heap.push(Reverse((T(v.arrive), Ev::Arrive(i))));
    }
    let mut caches: Vec<Cache> = Vec::new();
    let mut cache_of: HashMap<(usize, u32), usize> = HashMap::default();
    let mut watching: HashMap<usize, Watching> = HashMap::default();
    let mut origin_classes = Classes { by_key: HashMap::default(), of_flow: HashMap::default(), slot: vec![0; viewers.len()] };
    // Per viewer: its place in its cache's list.
    let mut cache_slot: Vec<u32> = vec![0; viewers.len()];
    let mut feeds: HashMap<usize, (FlowId, f64)> = HashMap::default();
    let mut routes_from: HashMap<usize, Routes> = HashMap::default();
    // Per AS: connections, bits/s, caches running; and their peaks.
    let mut per_as: Vec<(u32, f64, u32, u32, f64, u32)> = vec![(0, 0.0, 0, 0, 0.0, 0); t.ases.len()];
    let mut up_by_channel: HashMap<u32, Vec<usize>> = HashMap::default();
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
                    caches.push(Cache { access: as_idx, bps: 0.0, peak: (0, 0.0), channel: v.channel, source: None, dependents: 0, feed_key: None, state: CacheState::Booting, viewers: Vec::new(), running: false, stop_version: 0 });
                    caches.len() - 1
                });
                if !caches[c].running {
                    // A cache to start (or one stopped before): boot it,
                    // its feed from the origin or (cooperative) the nearest
                    // cache of its channel that serves.
                    caches[c].running = true;
                    let src = if cfg.cooperative { nearest(t, &mut routes_from, &caches, up_by_channel.get(&v.channel), as_idx, paths[as_idx].as_ref().map(Vec::len)) } else { None };
                    let src_cache = src.as_ref().map(|x| x.0);
                    let (src_as, path) = match src {
                        Some((s, p)) => (caches[s].access, Some(p)),
                        None => (origin, paths[as_idx].clone()),
                    };
                    if let Some(p) = path {
                        let key = if cfg.naive { usize::MAX - c } else { src_as * t.ases.len() + as_idx };
                        feed(&mut feeds, &mut net, key, p, cfg.feed_bps, 1.0);
                        caches[c].feed_key = Some(key);
                    }
                    caches[c].source = src_cache;
                    match src_cache {
                        Some(s) => {
                            caches[s].dependents += 1;
                            caches[s].stop_version += 1;
                            out.feeds_from_caches += 1;
                        }
                        None => out.feeds_from_origin += 1,
                    }
                    running += 1;
                    per_as[as_idx].2 += 1;
                    per_as[as_idx].5 = per_as[as_idx].5.max(per_as[as_idx].2);
                    out.caches.push((now, running));
                    heap.push(Reverse((T(now + cfg.boot_s), Ev::CacheUp(c))));
                }
                cache_slot[i] = caches[c].viewers.len() as u32;
                caches[c].viewers.push(i);
                caches[c].bps += v.bitrate;
                let cc = &mut caches[c];
                cc.peak.0 = cc.peak.0.max(cc.viewers.len() as u32);
                cc.peak.1 = cc.peak.1.max(cc.bps);
                let a = &mut per_as[as_idx];
                a.0 += 1;
                a.1 += v.bitrate;
                a.3 = a.3.max(a.0);
                a.4 = a.4.max(a.1);
                caches[c].stop_version += 1;
                let mut w = Watching { player: Player::new(now, v.bitrate, cfg.line_bps, cfg.start_s, cfg.edge_s), cache: c, class: None, version: 0 };
                match caches[c].state {
                    CacheState::Up => w.player.set_rate(now, w.player.demand()),
                    CacheState::Booting => match &paths[as_idx] {
                        Some(p) => {
                            let key = (group(i, as_idx), w.player.demand().to_bits());
                            origin_classes.join(i, &mut w, key, p, now, &mut net)
                        }
                        None => w.player.set_rate(now, 0.0),
                    },
                }
                watching.insert(i, w);
                plan(i, watching.get_mut(&i).expect("just put"), &mut heap);
                out.peak_viewers = out.peak_viewers.max(watching.len());
            }
            Ev::Leave(i) => {
                left += 1;
                if left.is_multiple_of(1000) {
                    progress(left);
                }
                let Some(mut w) = watching.remove(&i) else { continue };
                out.qoe[i] = w.player.finish(now);
                origin_classes.leave(i, &mut w, &mut net);
                let c = &mut caches[w.cache];
                let slot = cache_slot[i] as usize;
                c.viewers.swap_remove(slot);
                if let Some(&moved) = c.viewers.get(slot) {
                    cache_slot[moved] = slot as u32;
                }
                c.bps -= viewers[i].bitrate;
                let a = &mut per_as[c.access];
                a.0 -= 1;
                a.1 -= viewers[i].bitrate;
                if c.viewers.is_empty() {
                    c.stop_version += 1;
                    heap.push(Reverse((T(now + cfg.idle_s), Ev::CacheStop(w.cache, c.stop_version))));
                }
            }
            Ev::CacheUp(c) => {
                if !caches[c].running {
                    continue;
                }
                caches[c].state = CacheState::Up;
                up_by_channel.entry(caches[c].channel).or_default().push(c);
                for &i in &caches[c].viewers {
                    let w = watching.get_mut(&i).expect("a cache's viewers watch");
                    origin_classes.leave(i, w, &mut net);
                    let d = w.player.demand();
                    w.player.set_rate(now, d);
                    plan(i, w, &mut heap);
                }
            }
            Ev::CacheStop(c, version) => {
                let cache = &mut caches[c];
                if cache.stop_version != version || !cache.viewers.is_empty() || cache.dependents > 0 || !cache.running {
                    continue;
                }
                if let Some(key) = cache.feed_key.take() {
                    feed(&mut feeds, &mut net, key, Vec::new(), cfg.feed_bps, -1.0);
                }
                cache.running = false;
                cache.state = CacheState::Booting;
                if let Some(list) = up_by_channel.get_mut(&cache.channel) {
                    list.retain(|&x| x != c);
                }
                running -= 1;
                per_as[caches[c].access].2 -= 1;
                out.caches.push((now, running));
                // The cache that fed it may now be idle too.
                if let Some(s) = caches[c].source.take() {
                    let src = &mut caches[s];
                    src.dependents -= 1;
                    if src.dependents == 0 && src.viewers.is_empty() {
                        src.stop_version += 1;
                        heap.push(Reverse((T(now + cfg.idle_s), Ev::CacheStop(s, src.stop_version))));
                    }
                }
            }
            Ev::Buffer(i, version) => {
                let Some(w) = watching.get_mut(&i) else { continue };
                if w.version != version {
                    continue;
                }
                w.player.advance(now);
                let d = w.player.demand();
                match w.class {
                    // Into the class of its new demand (the solve below
                    // gives it the class's new rate).
                    Some(key) if key.1 != d.to_bits() => {
                        origin_classes.leave(i, w, &mut net);
                        let a = access[viewers[i].access];
                        let p = paths[a].as_ref().expect("a class has a path");
                        origin_classes.join(i, w, (key.0, d.to_bits()), p, now, &mut net);
                    }
                    Some(_) => {}
                    // Served by its cache or unreachable: its line or nothing.
                    None if w.player.rate() > 0.0 => w.player.set_rate(now, d),
                    None => {}
                }
                plan(i, w, &mut heap);
            }
        }
        net.solve(|f, r| {
            let Some(key) = origin_classes.of_flow.get(&f) else { return };
            let class = origin_classes.by_key.get_mut(key).expect("a class per class flow");
            if (r - class.applied).abs() <= tolerance * class.applied && r > 0.0 {
                return;
            }
            class.applied = r;
            for &i in &class.members {
                let w = watching.get_mut(&i).expect("a class's viewers watch");
                w.player.set_rate(now, r);
                plan(i, w, &mut heap);
            }
        });
    }
    out.per_cache = caches.iter().map(|c| c.peak).collect();
    out.per_as = access.iter().map(|&a| per_as[a]).filter(|a| a.3 > 0).map(|a| (a.3, a.4, a.5)).collect();
    Ok(out)
}

/// The classes of viewers streaming from the origin.
struct Classes {
    by_key: HashMap<Key, Class>,
    of_flow: HashMap<FlowId, Key>,
    /// Per viewer: its place in its class's members.
    slot: Vec<u32>,
}

impl Classes {
    /// Viewer `i` streams from the origin in class `key` (path `path`): it
    /// takes the class's rate as it stands (the next solve adjusts it).
    fn join(&mut self, i: usize, w: &mut Watching, key: Key, path: &[usize], now: f64, net: &mut MaxMin) {
        let class = self.by_key.entry(key).or_insert_with(|| {
            let flow = net.add_class(path.to_vec(), f64::from_bits(key.1), 0.0);
            self.of_flow.insert(flow, key);
            Class { flow, members: Vec::new(), applied: 0.0 }
        });
        self.slot[i] = class.members.len() as u32;
        class.members.push(i);
        net.set_count(class.flow, class.members.len() as f64);
        w.player.set_rate(now, class.applied);
        w.class = Some(key);
    }

    /// Viewer `i` stops streaming from the origin (if it did).
    fn leave(&mut self, i: usize, w: &mut Watching, net: &mut MaxMin) {
        let Some(key) = w.class.take() else { return };
        let class = self.by_key.get_mut(&key).expect("its class");
        let slot = self.slot[i] as usize;
        class.members.swap_remove(slot);
        if let Some(&moved) = class.members.get(slot) {
            self.slot[moved] = slot as u32;
        }
        if class.members.is_empty() {
            net.remove(class.flow);
            self.of_flow.remove(&class.flow);
            self.by_key.remove(&key);
        } else {
            net.set_count(class.flow, class.members.len() as f64);
        }
    }
}

/// Plan viewer `i`'s next buffer event under its current rate.
fn plan(i: usize, w: &mut Watching, heap: &mut BinaryHeap<Reverse<(T, Ev)>>) {
    w.version += 1;
    if let Some(at) = w.player.next_event() {
        heap.push(Reverse((T(at), Ev::Buffer(i, w.version))));
    }
}

/// One cache more (`delta` 1) or fewer (-1) pulling its feed over `path`
/// (needed for a new class only): the feeds with one `key` (source and
/// destination AS; the cache, naively) are one class.
fn feed(feeds: &mut HashMap<usize, (FlowId, f64)>, net: &mut MaxMin, key: usize, path: Vec<usize>, bps: f64, delta: f64) {
    let entry = feeds.entry(key).or_insert_with(|| (net.add_class(path, bps, 0.0), 0.0));
    entry.1 += delta;
    if entry.1 <= 0.0 {
        net.remove(entry.0);
        feeds.remove(&key);
    } else {
        net.set_count(entry.0, entry.1);
    }
}

/// The nearest cache among `up` (the serving caches of a channel) to
/// access AS `dest`, and its path there, if one is no farther than the
/// origin (`origin_hops`); ties to the lower-numbered cache. One search
/// from `dest` gives every candidate's distance (valley-free paths read
/// backwards are valley-free); the path is the chosen cache's.
fn nearest(t: &Topology, routes_from: &mut HashMap<usize, Routes>, caches: &[Cache], up: Option<&Vec<usize>>, dest: usize, origin_hops: Option<usize>) -> Option<(usize, Vec<usize>)> {
    let up = up.filter(|u| !u.is_empty())?;
    let back = Routes::from(t, dest);
    let (s, _) = up
        .iter()
        .filter(|&&s| caches[s].access != dest)
        .filter_map(|&s| back.hops(caches[s].access).map(|h| (s, h)))
        .filter(|&(_, h)| origin_hops.is_none_or(|o| h <= o))
        .min_by_key(|&(s, h)| (h, s))?;
    let from = caches[s].access;
    let path = routes_from.entry(from).or_insert_with(|| Routes::from(t, from)).path(dest)?;
    Some((s, path))
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
        // Figure 1's figures: no cache or AS above the viewers at once, a
        // cache's bitrates within its connections' (1 to 20 Mb/s each),
        // and an AS's caches within its channels (20).
        assert!(fast.per_cache.iter().all(|&(n, b)| n as usize <= fast.peak_viewers && b >= n as f64 * 1e6 - 1.0 && b <= n as f64 * 20e6 + 1.0));
        assert!(fast.per_as.len() == 3 && fast.per_as.iter().all(|&(n, _, caches)| n > 0 && (1..=20).contains(&caches)));
    }

    #[test]
    fn the_fast_run_tells_what_the_straightforward_one_does() {
        // Classes, the 1 % tolerance and the skipped fillings change the
        // figures by little: mean start-up delay and buffering within 2 %.
        let (t, o) = small(60e6);
        let p = Params { concurrency: 40.0, ..params(2000) };
        for boot in [0.0, 5.0] {
            let fast = run(&t, o, &p, &Config { boot_s: boot, idle_s: 1.0, ..Config::default() }, 2).unwrap();
            let naive = run(&t, o, &p, &Config { boot_s: boot, idle_s: 1.0, naive: true, ..Config::default() }, 2).unwrap();
            for (name, f) in [("start-up", &(|q: &Qoe| q.startup_delay_s) as &dyn Fn(&Qoe) -> f64), ("buffering", &|q: &Qoe| q.buffering_ratio), ("playback", &|q: &Qoe| q.playback_ratio)] {
                let (a, b) = (mean(&fast.qoe, f), mean(&naive.qoe, f));
                assert!((a - b).abs() <= 0.02 * b.abs().max(0.01), "boot {boot}: {name} {a} against {b}");
            }
        }
    }

    #[test]
    fn cooperative_caches_feed_one_another_and_spare_the_origin() {
        let (t, o) = small(60e6);
        let p = Params { concurrency: 60.0, ..params(3000) };
        let cfg = Config { boot_s: 2.0, idle_s: 5.0, ..Config::default() };
        let alone = run(&t, o, &p, &cfg, 6).unwrap();
        let coop = run(&t, o, &p, &Config { cooperative: true, ..cfg }, 6).unwrap();
        assert_eq!(alone.feeds_from_caches, 0);
        assert!(coop.feeds_from_caches > 0, "{:?}", (coop.feeds_from_origin, coop.feeds_from_caches));
        assert!(coop.feeds_from_origin < alone.feeds_from_origin, "{} against {}", coop.feeds_from_origin, alone.feeds_from_origin);
        // Fewer feeds on the origin's thin link: no worse a start.
        let (a, c) = (mean(&alone.qoe, |q| q.startup_delay_s), mean(&coop.qoe, |q| q.startup_delay_s));
        assert!(c <= a * 1.02, "start-up {c} cooperative against {a}");
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
