//! Max-min fair sharing of links among flows, each flow capped by its own
//! demand (a viewer's line, a video's bitrate): no flow can get more
//! without taking from one that has less. A flow may stand for a class of
//! `count` identical flows (same path, same demand): it is filled as that
//! many, and its rate is each one's. [`MaxMin`] keeps the rates and
//! recomputes, after flows come, go or change demand, only the flows
//! connected to a changed link (through flows sharing links), by
//! progressive filling: every flow of that part rises at the same pace
//! until a link it crosses is full or it reaches its demand, and then
//! stays. While no link carries more demand than its capacity (the usual
//! case when caches serve), every flow simply gets its demand and a change
//! costs only the flows it touched: the solver keeps each link's demand
//! and how many links are over, and fills only when some are.
//! [`from_scratch`] is the same filling over every flow — the
//! straightforward way, kept as the tests' reference and the benchmark's
//! baseline.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A flow's handle.
pub type FlowId = usize;

struct Flow {
    /// Links crossed.
    path: Vec<usize>,
    /// Its place in each of those links' lists.
    pos: Vec<usize>,
    demand: f64,
    /// How many identical flows it stands for.
    count: f64,
    rate: f64,
}

/// Rates of flows over links of fixed capacities.
pub struct MaxMin {
    cap: Vec<f64>,
    /// Per link: (flow, index of the link in the flow's path).
    on: Vec<Vec<(FlowId, usize)>>,
    flows: Vec<Option<Flow>>,
    free: Vec<FlowId>,
    /// Links whose flows changed since the last [`MaxMin::solve`].
    dirty: Vec<usize>,
    /// Flows added or changed since then.
    touched: Vec<FlowId>,
    /// Per link: the demand of its flows; and how many links have more
    /// than their capacity.
    load: Vec<f64>,
    over: usize,
    /// Flows held below their demand by the last filling.
    limited: Vec<FlowId>,
    /// Every solve fills every flow, from scratch (the straightforward
    /// way, for comparison).
    pub naive: bool,
    // Scratch, kept between solves.
    mark_link: Vec<u32>,
    mark_flow: Vec<u32>,
    epoch: u32,
}

/// A heap entry: a link's fill level, smallest first.
#[derive(PartialEq)]
struct Level(f64, usize, u32);

impl Eq for Level {}

impl PartialOrd for Level {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Level {
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
    }
}

impl MaxMin {
    /// Links of capacities `cap` (bits/s), no flows yet.
    pub fn new(cap: Vec<f64>) -> MaxMin {
        let n = cap.len();
        MaxMin {
            cap,
            on: vec![Vec::new(); n],
            flows: Vec::new(),
            free: Vec::new(),
            dirty: Vec::new(),
            touched: Vec::new(),
            load: vec![0.0; n],
            over: 0,
            limited: Vec::new(),
            naive: false,
            mark_link: vec![0; n],
            mark_flow: Vec::new(),
            epoch: 0,
        }
    }

    /// Add `delta` to the demand on the links of `path`, counting the
    /// links that go over or come back under their capacity.
    fn add_load(&mut self, path: &[usize], delta: f64) {
        for &l in path {
            let cap = self.cap[l] * (1.0 + 1e-12);
            let was = self.load[l] > cap;
            self.load[l] += delta;
            if self.on[l].is_empty() {
                self.load[l] = 0.0;
            }
            let is = self.load[l] > cap;
            if is != was {
                if is {
                    self.over += 1;
                } else {
                    self.over -= 1;
                }
            }
        }
    }

    /// A new flow over `path` (link indices, no repeats) wanting at most
    /// `demand`; its rate is 0 until the next [`MaxMin::solve`].
    pub fn add(&mut self, path: Vec<usize>, demand: f64) -> FlowId {
        self.add_class(path, demand, 1.0)
    }

    /// A class of `count` identical flows over `path`, each wanting at most
    /// `demand`.
    pub fn add_class(&mut self, path: Vec<usize>, demand: f64, count: f64) -> FlowId {
        let id = self.free.pop().unwrap_or_else(|| {
            self.flows.push(None);
            self.mark_flow.push(0);
            self.flows.len() - 1
        });
        let mut pos = Vec::with_capacity(path.len());
        for (k, &l) in path.iter().enumerate() {
            pos.push(self.on[l].len());
            self.on[l].push((id, k));
            self.dirty.push(l);
        }
        self.add_load(&path, demand * count);
        self.flows[id] = Some(Flow { path, pos, demand, count, rate: 0.0 });
        self.touched.push(id);
        id
    }

    /// Change how many flows class `f` stands for.
    pub fn set_count(&mut self, f: FlowId, count: f64) {
        let flow = self.flows[f].as_mut().expect("a live flow");
        let (path, delta) = (flow.path.clone(), flow.demand * (count - flow.count));
        flow.count = count;
        self.dirty.extend_from_slice(&path);
        self.add_load(&path, delta);
        self.touched.push(f);
    }

    /// Remove flow `f`.
    pub fn remove(&mut self, f: FlowId) {
        let flow = self.flows[f].take().expect("a live flow");
        for (k, &l) in flow.path.iter().enumerate() {
            let i = flow.pos[k];
            self.on[l].swap_remove(i);
            if let Some(&(moved, mk)) = self.on[l].get(i) {
                self.flows[moved].as_mut().expect("listed flows live").pos[mk] = i;
            }
            self.dirty.push(l);
        }
        self.add_load(&flow.path, -flow.demand * flow.count);
        self.free.push(f);
    }

    /// Change flow `f`'s demand.
    pub fn set_demand(&mut self, f: FlowId, demand: f64) {
        let flow = self.flows[f].as_mut().expect("a live flow");
        let (path, delta) = (flow.path.clone(), (demand - flow.demand) * flow.count);
        flow.demand = demand;
        self.dirty.extend_from_slice(&path);
        self.add_load(&path, delta);
        self.touched.push(f);
    }

    /// Flow `f`'s rate as of the last solve.
    pub fn rate(&self, f: FlowId) -> f64 {
        self.flows[f].as_ref().map_or(0.0, |fl| fl.rate)
    }

    /// The rates of the flows on links that changed, and of every flow
    /// connected to them, made max-min fair again; `changed` gets each
    /// flow whose rate moved. Returns how many flows were recomputed.
    pub fn solve(&mut self, mut changed: impl FnMut(FlowId, f64)) -> usize {
        if self.dirty.is_empty() {
            return 0;
        }
        if self.naive {
            self.dirty = (0..self.cap.len()).filter(|&l| !self.on[l].is_empty()).collect();
        } else if self.over == 0 {
            // No link is over: every flow gets its demand; only those
            // touched, or held below it before, change.
            self.dirty.clear();
            let mut n = 0;
            let mut flows = std::mem::take(&mut self.touched);
            flows.append(&mut self.limited);
            for f in flows {
                if let Some(fl) = self.flows[f].as_mut() {
                    n += 1;
                    if fl.rate != fl.demand {
                        fl.rate = fl.demand;
                        changed(f, fl.demand);
                    }
                }
            }
            return n;
        }
        self.touched.clear();
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.mark_link.fill(0);
            self.mark_flow.fill(0);
            self.epoch = 1;
        }
        let e = self.epoch;
        // The part connected to the dirty links.
        let mut links = std::mem::take(&mut self.dirty);
        links.retain(|&l| std::mem::replace(&mut self.mark_link[l], e) != e);
        let mut flows: Vec<FlowId> = Vec::new();
        let mut i = 0;
        while i < links.len() {
            let l = links[i];
            i += 1;
            for &(f, _) in &self.on[l] {
                if self.mark_flow[f] == e {
                    continue;
                }
                self.mark_flow[f] = e;
                flows.push(f);
                for &m in &self.flows[f].as_ref().expect("listed flows live").path {
                    if self.mark_link[m] != e {
                        self.mark_link[m] = e;
                        links.push(m);
                    }
                }
            }
        }
        let rates = fill(&self.cap, &links, &flows, |f| {
            let fl = self.flows[f].as_ref().expect("live");
            (&fl.path[..], fl.demand, fl.count)
        });
        for (&f, &r) in flows.iter().zip(&rates) {
            let fl = self.flows[f].as_mut().expect("live");
            if r < fl.demand {
                self.limited.push(f);
            }
            if fl.rate != r {
                fl.rate = r;
                changed(f, r);
            }
        }
        // (A flow may be listed twice, or have gone: harmless.)
        self.limited.sort_unstable();
        self.limited.dedup();
        flows.len()
    }
}

/// Progressive filling of `flows` over `links` (every link any of them
/// crosses; `flow(f)` gives a flow's path, demand and count): their rates,
/// in the order of `flows`.
fn fill<'a>(cap: &[f64], links: &[usize], flows: &[FlowId], flow: impl Fn(FlowId) -> (&'a [usize], f64, f64)) -> Vec<f64> {
    // Local numbering of the links.
    let mut local = std::collections::HashMap::with_capacity(links.len());
    for (i, &l) in links.iter().enumerate() {
        local.insert(l, i);
    }
    let mut left: Vec<f64> = links.iter().map(|&l| cap[l]).collect();
    // Per link: unfrozen entries, and the flows they stand for.
    let mut count = vec![0u32; links.len()];
    let mut weight = vec![0.0f64; links.len()];
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); links.len()];
    let paths: Vec<Vec<usize>> = flows.iter().map(|&f| flow(f).0.iter().map(|l| local[l]).collect()).collect();
    let many: Vec<f64> = flows.iter().map(|&f| flow(f).2.max(0.0)).collect();
    for (k, p) in paths.iter().enumerate() {
        for &l in p {
            count[l] += 1;
            weight[l] += many[k];
            members[l].push(k);
        }
    }
    let mut by_demand: Vec<usize> = (0..flows.len()).collect();
    let demand: Vec<f64> = flows.iter().map(|&f| flow(f).1.max(0.0)).collect();
    by_demand.sort_by(|&a, &b| demand[a].total_cmp(&demand[b]));
    let mut rate = vec![f64::NAN; flows.len()];
    let mut version = vec![0u32; links.len()];
    let level = |left: f64, weight: f64| if weight > 0.0 { (left / weight).max(0.0) } else { f64::INFINITY };
    let mut heap: BinaryHeap<Level> = (0..links.len()).filter(|&l| count[l] > 0).map(|l| Level(level(left[l], weight[l]), l, 0)).collect();
    let mut next_demand = 0;
    let mut frozen = 0;
    let freeze = |k: usize, r: f64, rate: &mut Vec<f64>, left: &mut Vec<f64>, count: &mut Vec<u32>, weight: &mut Vec<f64>, version: &mut Vec<u32>, heap: &mut BinaryHeap<Level>| {
        rate[k] = r;
        for &l in &paths[k] {
            left[l] -= r * many[k];
            count[l] -= 1;
            weight[l] -= many[k];
            version[l] += 1;
            if count[l] > 0 {
                heap.push(Level(level(left[l], weight[l]), l, version[l]));
            }
        }
    };
    while frozen < flows.len() {
        // Skip flows already frozen among the smallest demands.
        while next_demand < by_demand.len() && !rate[by_demand[next_demand]].is_nan() {
            next_demand += 1;
        }
        while let Some(top) = heap.peek() {
            if top.2 != version[top.1] || count[top.1] == 0 {
                heap.pop();
            } else {
                break;
            }
        }
        let link_level = heap.peek().map_or(f64::INFINITY, |t| t.0);
        let d = by_demand.get(next_demand).map_or(f64::INFINITY, |&k| demand[k]);
        if d <= link_level {
            // A flow reaches its demand before any of its links fills.
            let k = by_demand[next_demand];
            freeze(k, d, &mut rate, &mut left, &mut count, &mut weight, &mut version, &mut heap);
            frozen += 1;
        } else {
            // A link fills: its flows stay at its level.
            let Level(level, l, _) = heap.pop().expect("a level below infinity");
            let level = if level.is_finite() { level.max(0.0) } else { 0.0 };
            for k in members[l].clone() {
                if rate[k].is_nan() {
                    freeze(k, level, &mut rate, &mut left, &mut count, &mut weight, &mut version, &mut heap);
                    frozen += 1;
                }
            }
        }
    }
    rate
}

/// Max-min fair rates of `flows` (path, demand) over links of capacities
/// `cap`, computed from nothing.
pub fn from_scratch(cap: &[f64], flows: &[(Vec<usize>, f64)]) -> Vec<f64> {
    let mut links: Vec<usize> = flows.iter().flat_map(|f| f.0.iter().copied()).collect();
    links.sort_unstable();
    links.dedup();
    let ids: Vec<FlowId> = (0..flows.len()).collect();
    fill(cap, &links, &ids, |f| (&flows[f].0[..], flows[f].1, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    fn solved(m: &mut MaxMin) -> usize {
        m.solve(|_, _| {})
    }

    #[test]
    fn shares_are_worked_out_by_hand() {
        // One link of 10: two flows get 5 each; a flow wanting 2 gets 2
        // and the other 8.
        let mut m = MaxMin::new(vec![10.0]);
        let a = m.add(vec![0], 100.0);
        let b = m.add(vec![0], 100.0);
        solved(&mut m);
        assert_eq!((m.rate(a), m.rate(b)), (5.0, 5.0));
        m.set_demand(a, 2.0);
        solved(&mut m);
        assert_eq!((m.rate(a), m.rate(b)), (2.0, 8.0));
        // The parking lot: links 0 and 1 of 10; A crosses both, B uses
        // link 0, C link 1: 5 each.
        let mut m = MaxMin::new(vec![10.0, 10.0]);
        let a = m.add(vec![0, 1], 100.0);
        let b = m.add(vec![0], 100.0);
        let c = m.add(vec![1], 100.0);
        solved(&mut m);
        assert_eq!([m.rate(a), m.rate(b), m.rate(c)], [5.0, 5.0, 5.0]);
    }

    #[test]
    fn a_class_is_filled_as_its_flows() {
        // Three flows, and one class of three, over the same links: the
        // same rates.
        let cap = vec![12.0, 5.0];
        let mut m = MaxMin::new(cap.clone());
        let c = m.add_class(vec![0], 100.0, 3.0);
        let a = m.add(vec![0, 1], 100.0);
        let b = m.add(vec![1], 1.0);
        solved(&mut m);
        let want = from_scratch(&cap, &[(vec![0], 100.0), (vec![0], 100.0), (vec![0], 100.0), (vec![0, 1], 100.0), (vec![1], 1.0)]);
        assert_eq!([m.rate(c), m.rate(a), m.rate(b)], [want[0], want[3], want[4]]);
        assert_eq!(want, [3.0, 3.0, 3.0, 3.0, 1.0]);
        // Two of the class leave: link 0 (12) between one of it and A,
        // A held to 4 by link 1 (5 less B's 1): the class member gets 8.
        m.set_count(c, 1.0);
        solved(&mut m);
        assert_eq!([m.rate(c), m.rate(a), m.rate(b)], [8.0, 4.0, 1.0]);
        // An empty class takes nothing.
        m.set_count(c, 0.0);
        solved(&mut m);
        assert_eq!(m.rate(a), 4.0);
    }

    #[test]
    fn a_bottleneck_that_moves() {
        // Link 0 of 10 (flows A, B), link 1 of 4 (A): A is held to 4 by
        // link 1, B gets the 6 left on link 0.
        let mut m = MaxMin::new(vec![10.0, 4.0]);
        let a = m.add(vec![0, 1], 100.0);
        let b = m.add(vec![0], 100.0);
        solved(&mut m);
        assert_eq!((m.rate(a), m.rate(b)), (4.0, 6.0));
        // D joins A on link 1: 2 each there; B rises to 8.
        let d = m.add(vec![1], 100.0);
        solved(&mut m);
        assert_eq!([m.rate(a), m.rate(b), m.rate(d)], [2.0, 8.0, 2.0]);
        // D leaves, E and F join link 0: link 0 (10 over A, B, E, F: 2.5)
        // is now A's bottleneck, not link 1 (4).
        m.remove(d);
        let e = m.add(vec![0], 100.0);
        let f = m.add(vec![0], 100.0);
        solved(&mut m);
        assert_eq!([m.rate(a), m.rate(b), m.rate(e), m.rate(f)], [2.5, 2.5, 2.5, 2.5]);
        // B wants only 1: the others share 9 on link 0 (3 each, under
        // link 1's 4).
        m.set_demand(b, 1.0);
        solved(&mut m);
        assert_eq!([m.rate(a), m.rate(b), m.rate(e), m.rate(f)], [3.0, 1.0, 3.0, 3.0]);
    }

    #[test]
    fn only_the_connected_flows_are_recomputed() {
        // Two separate links: a change on one leaves the other's flows.
        let mut m = MaxMin::new(vec![10.0, 10.0]);
        let a = m.add(vec![0], 100.0);
        let _b = m.add(vec![1], 100.0);
        assert_eq!(solved(&mut m), 2);
        let c = m.add(vec![0], 100.0);
        let mut moved = Vec::new();
        assert_eq!(m.solve(|f, r| moved.push((f, r))), 2);
        moved.sort_by_key(|x| x.0);
        assert_eq!(moved, [(a, 5.0), (c, 5.0)]);
        assert_eq!(solved(&mut m), 0, "nothing changed");
    }

    #[test]
    fn incremental_rates_are_those_from_scratch_and_fair() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for round in 0..20 {
            let nl = rng.random_range(1..12);
            let cap: Vec<f64> = (0..nl).map(|_| rng.random_range(1..50) as f64).collect();
            let mut m = MaxMin::new(cap.clone());
            let mut live: Vec<(FlowId, Vec<usize>, f64)> = Vec::new();
            for _step in 0..60 {
                if live.is_empty() || rng.random_bool(0.6) {
                    let mut path: Vec<usize> = (0..nl).filter(|_| rng.random_bool(0.3)).collect();
                    if path.is_empty() {
                        path.push(rng.random_range(0..nl));
                    }
                    let demand = if rng.random_bool(0.3) { rng.random_range(1..20) as f64 } else { 1e9 };
                    let id = m.add(path.clone(), demand);
                    live.push((id, path, demand));
                } else if rng.random_bool(0.5) {
                    let k = rng.random_range(0..live.len());
                    m.remove(live.swap_remove(k).0);
                } else {
                    let k = rng.random_range(0..live.len());
                    live[k].2 = rng.random_range(1..30) as f64;
                    m.set_demand(live[k].0, live[k].2);
                }
                solved(&mut m);
                let all: Vec<(Vec<usize>, f64)> = live.iter().map(|x| (x.1.clone(), x.2)).collect();
                let want = from_scratch(&cap, &all);
                for (x, w) in live.iter().zip(&want) {
                    assert!(close(m.rate(x.0), *w), "round {round}: {} against {}", m.rate(x.0), w);
                }
                // Fair: no link over its capacity; every flow at its
                // demand or crossing a full link on which no flow has more.
                let mut load = vec![0.0; nl];
                for (x, &r) in live.iter().zip(&want) {
                    for &l in &x.1 {
                        load[l] += r;
                    }
                }
                for l in 0..nl {
                    assert!(load[l] <= cap[l] * (1.0 + 1e-9), "link {l} over capacity");
                }
                for (x, &r) in live.iter().zip(&want) {
                    let bottleneck = x.1.iter().any(|&l| {
                        close(load[l], cap[l]) && live.iter().zip(&want).filter(|(y, _)| y.1.contains(&l)).all(|(_, &s)| s <= r * (1.0 + 1e-9))
                    });
                    assert!(close(r, x.2) || bottleneck, "flow at {r} has no bottleneck");
                }
            }
        }
    }
}
