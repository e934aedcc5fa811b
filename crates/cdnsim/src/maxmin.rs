//! Max-min fair sharing of links among flows, each flow capped by its own
//! demand (a viewer's line, a video's bitrate): no flow can get more
//! without taking from one that has less. A flow may stand for a class of
//! `count` identical flows (same path, same demand): it is filled as that
//! many, and its rate is each one's. [`MaxMin`] keeps the rates and, after
//! flows come, go or change, recomputes only what the change can move:
//!
//! - **Local changes cost only the flow changed.** A flow that comes (or
//!   grows) where every link it crosses has room for its demand gets its
//!   demand and moves no one: the others' bottlenecks are full links it
//!   does not cross. A flow that goes (or shrinks, or wants less) and
//!   crosses no full link frees nothing anyone is held back by. The
//!   solver keeps each link's use to tell.
//! - **Other changes refill their part.** The flows connected to a changed
//!   link (through flows sharing links) are refilled by progressive
//!   filling: every flow of that part rises at the same pace until a link
//!   it crosses is full or it reaches its demand, and then stays.
//!
//! [`from_scratch`] is the same filling over every flow — the
//! straightforward way, kept as the tests' reference and the benchmark's
//! baseline. Hand-written: no crate solves max-min fairness incrementally.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A flow's handle.
pub type FlowId = usize;

/// A link counts as full within this fraction of its capacity, and a flow
/// fits into a link's room only with this much to spare: rounding never
/// makes a full link look free.
const SLACK: f64 = 1e-9;

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
    /// Per link: the rates of its flows together.
    used: Vec<f64>,
    /// Links whose part is to be refilled at the next [`MaxMin::solve`].
    dirty: Vec<usize>,
    /// Flows whose rate a local change set since then.
    touched: Vec<FlowId>,
    /// Every solve fills every flow, from scratch (the straightforward
    /// way, for comparison).
    pub naive: bool,
    // Scratch, kept between solves.
    mark_link: Vec<u32>,
    mark_flow: Vec<u32>,
    epoch: u32,
    room: Vec<f64>,
    filler: Filler,
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
            used: vec![0.0; n],
            dirty: Vec::new(),
            touched: Vec::new(),
            naive: false,
            mark_link: vec![0; n],
            mark_flow: Vec::new(),
            epoch: 0,
            room: Vec::new(),
            filler: Filler::new(n),
        }
    }

    /// Every link of `path` has room for `more` besides its use.
    fn room(&self, path: &[usize], more: f64) -> bool {
        !self.naive && path.iter().all(|&l| self.used[l] + more <= self.cap[l] * (1.0 - SLACK))
    }

    /// No link of `path` is full.
    fn none_full(&self, path: &[usize]) -> bool {
        self.room(path, 0.0)
    }

    fn add_use(&mut self, path: &[usize], delta: f64) {
        for &l in path {
            self.used[l] += delta;
        }
    }

    fn flow(&self, f: FlowId) -> &Flow {
        self.flows[f].as_ref().expect("a live flow")
    }

    /// A new flow over `path` (link indices, no repeats) wanting at most
    /// `demand`; its rate is known after the next [`MaxMin::solve`].
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
        }
        let rate = if self.room(&path, demand * count) {
            self.add_use(&path, demand * count);
            self.touched.push(id);
            demand
        } else {
            self.dirty.extend_from_slice(&path);
            0.0
        };
        self.flows[id] = Some(Flow { path, pos, demand, count, rate });
        id
    }

    /// Change how many flows class `f` stands for.
    pub fn set_count(&mut self, f: FlowId, count: f64) {
        let fl = self.flow(f);
        let (rate, delta) = (fl.rate, count - fl.count);
        let at_demand = fl.rate == fl.demand;
        let local = if delta >= 0.0 { at_demand && self.room(&fl.path, fl.demand * delta) } else { self.none_full(&fl.path) };
        let path = std::mem::take(&mut self.flows[f].as_mut().expect("live").path);
        if local {
            self.add_use(&path, rate * delta);
        } else {
            self.dirty.extend_from_slice(&path);
        }
        let fl = self.flows[f].as_mut().expect("live");
        fl.path = path;
        fl.count = count;
    }

    /// Remove flow `f`.
    pub fn remove(&mut self, f: FlowId) {
        let local = self.none_full(&self.flow(f).path);
        let flow = self.flows[f].take().expect("a live flow");
        for (k, &l) in flow.path.iter().enumerate() {
            let i = flow.pos[k];
            self.on[l].swap_remove(i);
            if let Some(&(moved, mk)) = self.on[l].get(i) {
                self.flows[moved].as_mut().expect("listed flows live").pos[mk] = i;
            }
        }
        if local {
            self.add_use(&flow.path, -flow.rate * flow.count);
        } else {
            self.dirty.extend_from_slice(&flow.path);
        }
        self.free.push(f);
    }

    /// Change flow `f`'s demand.
    pub fn set_demand(&mut self, f: FlowId, demand: f64) {
        let fl = self.flow(f);
        let (rate, count) = (fl.rate, fl.count);
        let new_rate = if fl.rate == fl.demand {
            // At its demand: it takes the new one where there is room, or
            // gives some back where nobody is held back.
            let fits = if demand > rate { self.room(&fl.path, (demand - rate) * count) } else { self.none_full(&fl.path) };
            fits.then_some(demand)
        } else {
            // Held back by a full link: still, unless it now wants less.
            (demand >= rate && !self.naive).then_some(rate)
        };
        let path = std::mem::take(&mut self.flows[f].as_mut().expect("live").path);
        match new_rate {
            Some(r) => {
                self.add_use(&path, (r - rate) * count);
                if r != rate {
                    self.touched.push(f);
                }
            }
            None => self.dirty.extend_from_slice(&path),
        }
        let fl = self.flows[f].as_mut().expect("live");
        fl.path = path;
        fl.demand = demand;
        if let Some(r) = new_rate {
            fl.rate = r;
        }
    }

    /// Flow `f`'s rate as of the last solve.
    pub fn rate(&self, f: FlowId) -> f64 {
        self.flows[f].as_ref().map_or(0.0, |fl| fl.rate)
    }

    /// Make the rates max-min fair again: `changed` gets each flow whose
    /// rate moved since the last solve. Returns how many flows were
    /// refilled.
    ///
    /// The part refilled: the flows on the changed links, and through the
    /// full links they cross the flows held back there, and so on (a link
    /// with room holds no one back: the change cannot move its other
    /// flows). Links with room that the part crosses bound it with what
    /// their other flows use; if one of them fills, its flows join the part
    /// and it is filled again.
    pub fn solve(&mut self, mut changed: impl FnMut(FlowId, f64)) -> usize {
        for f in std::mem::take(&mut self.touched) {
            if let Some(fl) = self.flows[f].as_ref() {
                changed(f, fl.rate);
            }
        }
        if self.dirty.is_empty() {
            return 0;
        }
        if self.naive {
            self.dirty = (0..self.cap.len()).filter(|&l| !self.on[l].is_empty()).collect();
        }
        // Epochs mark the part's links (2e: refilled, 2e + 1: its bounds)
        // and flows (e).
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch >= u32::MAX / 2 {
            self.mark_link.fill(0);
            self.mark_flow.fill(0);
            self.epoch = 1;
        }
        let e = self.epoch;
        let (whole, bound) = (2 * e, 2 * e + 1);
        let mut links = std::mem::take(&mut self.dirty);
        links.retain(|&l| std::mem::replace(&mut self.mark_link[l], whole) != whole);
        let mut bounds: Vec<usize> = Vec::new();
        let mut flows: Vec<FlowId> = Vec::new();
        let mut i = 0;
        loop {
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
                        if self.mark_link[m] == whole {
                            continue;
                        }
                        if self.naive || !self.none_full(&[m]) {
                            self.mark_link[m] = whole;
                            links.push(m);
                        } else if self.mark_link[m] != bound {
                            self.mark_link[m] = bound;
                            bounds.push(m);
                        }
                    }
                }
            }
            // The room on each link: all of it on those refilled, what the
            // other flows leave on the bounds.
            bounds.retain(|&l| self.mark_link[l] == bound);
            let mut all = links.clone();
            all.extend_from_slice(&bounds);
            self.room.clear();
            self.room.extend(links.iter().map(|&l| self.cap[l]));
            for &l in &bounds {
                let others: f64 = self.on[l].iter().filter(|&&(f, _)| self.mark_flow[f] != e).map(|&(f, _)| {
                    let fl = self.flows[f].as_ref().expect("live");
                    fl.rate * fl.count
                }).sum();
                self.room.push(self.cap[l] - others);
            }
            let flows_of = &self.flows;
            self.filler.fill(&all, &self.room, &flows, |f| {
                let fl = flows_of[f].as_ref().expect("live");
                (&fl.path[..], fl.demand, fl.count)
            });
            // A bound now full, with other flows on it: they join.
            let mut grew = false;
            let base = links.len();
            for (k, &l) in bounds.iter().enumerate() {
                let room = self.room[base + k];
                let others = self.cap[l] - room;
                if others > 0.0 && self.filler.left_at(base + k) <= self.cap[l] * SLACK {
                    self.mark_link[l] = whole;
                    links.push(l);
                    grew = true;
                }
            }
            if grew {
                continue;
            }
            for (&f, &r) in flows.iter().zip(&self.filler.rate) {
                let fl = self.flows[f].as_mut().expect("live");
                if fl.rate != r {
                    fl.rate = r;
                    changed(f, r);
                }
            }
            // The use of every link the part crossed, afresh.
            for &l in &all {
                self.used[l] = self.on[l].iter().map(|&(f, _)| {
                    let fl = self.flows[f].as_ref().expect("live");
                    fl.rate * fl.count
                }).sum();
            }
            break;
        }
        let n = flows.len();
        self.dirty = links;
        self.dirty.clear();
        n
    }
}

/// Progressive filling, its tables kept from one filling to the next (a
/// filling allocates nothing once they have grown).
struct Filler {
    /// Per link of the network: its number in this filling.
    slot: Vec<usize>,
    // Per link of the filling.
    left: Vec<f64>,
    count: Vec<u32>,
    weight: Vec<f64>,
    version: Vec<u32>,
    /// Its flows: `members[start[l]..start[l + 1]]`.
    start: Vec<usize>,
    members: Vec<usize>,
    // Per flow of the filling.
    path_start: Vec<usize>,
    path_links: Vec<usize>,
    many: Vec<f64>,
    demand: Vec<f64>,
    by_demand: Vec<usize>,
    rate: Vec<f64>,
    heap: BinaryHeap<Level>,
}

impl Filler {
    fn new(links: usize) -> Filler {
        Filler {
            slot: vec![0; links],
            left: Vec::new(),
            count: Vec::new(),
            weight: Vec::new(),
            version: Vec::new(),
            start: Vec::new(),
            members: Vec::new(),
            path_start: Vec::new(),
            path_links: Vec::new(),
            many: Vec::new(),
            demand: Vec::new(),
            by_demand: Vec::new(),
            rate: Vec::new(),
            heap: BinaryHeap::new(),
        }
    }

    /// The rates of `flows` over `links` (every link any of them crosses,
    /// with `room[i]` for them on `links[i]`; `flow(f)` gives a flow's
    /// path, demand and count), in the order of `flows`.
    fn fill<'a>(&mut self, links: &[usize], room: &[f64], flows: &[FlowId], flow: impl Fn(FlowId) -> (&'a [usize], f64, f64)) -> &[f64] {
        let (nl, nf) = (links.len(), flows.len());
        for (i, &l) in links.iter().enumerate() {
            self.slot[l] = i;
        }
        self.left.clear();
        self.left.extend_from_slice(room);
        self.count.clear();
        self.count.resize(nl, 0);
        self.weight.clear();
        self.weight.resize(nl, 0.0);
        self.version.clear();
        self.version.resize(nl, 0);
        self.path_start.clear();
        self.path_links.clear();
        self.many.clear();
        self.demand.clear();
        for &f in flows {
            let (path, demand, many) = flow(f);
            let many = many.max(0.0);
            self.path_start.push(self.path_links.len());
            for &l in path {
                let s = self.slot[l];
                self.path_links.push(s);
                self.count[s] += 1;
                self.weight[s] += many;
            }
            self.many.push(many);
            self.demand.push(demand.max(0.0));
        }
        self.path_start.push(self.path_links.len());
        // Each link's flows, in one table.
        self.start.clear();
        self.start.push(0);
        for l in 0..nl {
            let s = self.start[l] + self.count[l] as usize;
            self.start.push(s);
        }
        self.members.clear();
        self.members.resize(self.path_links.len(), 0);
        let mut at = self.start[..nl].to_vec();
        for k in 0..nf {
            for &s in &self.path_links[self.path_start[k]..self.path_start[k + 1]] {
                self.members[at[s]] = k;
                at[s] += 1;
            }
        }
        self.by_demand.clear();
        self.by_demand.extend(0..nf);
        let demand = &self.demand;
        self.by_demand.sort_unstable_by(|&a, &b| demand[a].total_cmp(&demand[b]).then(a.cmp(&b)));
        self.rate.clear();
        self.rate.resize(nf, f64::NAN);
        let level = |left: f64, weight: f64| if weight > 0.0 { (left / weight).max(0.0) } else { f64::INFINITY };
        self.heap.clear();
        for l in 0..nl {
            if self.count[l] > 0 {
                self.heap.push(Level(level(self.left[l], self.weight[l]), l, 0));
            }
        }
        let mut next_demand = 0;
        let mut frozen = 0;
        while frozen < nf {
            // Skip flows already frozen among the smallest demands.
            while next_demand < nf && !self.rate[self.by_demand[next_demand]].is_nan() {
                next_demand += 1;
            }
            // A link's level only rises as flows freeze (each at or below
            // the lowest level), so a stale entry is low: on top, it is
            // brought up to date and put back, one entry a link.
            while let Some(&Level(_, l, v)) = self.heap.peek() {
                if self.count[l] == 0 {
                    self.heap.pop();
                } else if v != self.version[l] {
                    self.heap.pop();
                    self.heap.push(Level(level(self.left[l], self.weight[l]), l, self.version[l]));
                } else {
                    break;
                }
            }
            let link_level = self.heap.peek().map_or(f64::INFINITY, |t| t.0);
            let d = self.by_demand.get(next_demand).map_or(f64::INFINITY, |&k| self.demand[k]);
            if d <= link_level {
                // A flow reaches its demand before any of its links fills.
                let k = self.by_demand[next_demand];
                self.freeze(k, d);
                frozen += 1;
            } else {
                // A link fills: its flows stay at its level.
                let Level(at, l, _) = self.heap.pop().expect("a level below infinity");
                let at = if at.is_finite() { at.max(0.0) } else { 0.0 };
                for m in self.start[l]..self.start[l + 1] {
                    let k = self.members[m];
                    if self.rate[k].is_nan() {
                        self.freeze(k, at);
                        frozen += 1;
                    }
                }
            }
        }
        &self.rate
    }

    /// The room left on the filling's link `i` after the last filling.
    fn left_at(&self, i: usize) -> f64 {
        self.left[i]
    }

    /// Flow `k` stays at rate `r`: its links have that much less room.
    fn freeze(&mut self, k: usize, r: f64) {
        self.rate[k] = r;
        let many = self.many[k];
        for &l in &self.path_links[self.path_start[k]..self.path_start[k + 1]] {
            self.left[l] -= r * many;
            self.count[l] -= 1;
            self.weight[l] -= many;
            self.version[l] += 1;
        }
    }
}

/// Max-min fair rates of `flows` (path, demand) over links of capacities
/// `cap`, computed from nothing.
pub fn from_scratch(cap: &[f64], flows: &[(Vec<usize>, f64)]) -> Vec<f64> {
    let mut links: Vec<usize> = flows.iter().flat_map(|f| f.0.iter().copied()).collect();
    links.sort_unstable();
    links.dedup();
    let ids: Vec<FlowId> = (0..flows.len()).collect();
    let room: Vec<f64> = links.iter().map(|&l| cap[l]).collect();
    Filler::new(cap.len()).fill(&links, &room, &ids, |f| (&flows[f].0[..], flows[f].1, 1.0)).to_vec()
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
    fn the_part_refilled_stops_at_links_with_room() {
        // Link 0 of 10 (A, C), link 1 of 30 (A, and B wanting 22): A and C
        // get 5, B its 22, and link 1 has room.
        let mut m = MaxMin::new(vec![10.0, 30.0]);
        let a = m.add(vec![0, 1], 100.0);
        let c = m.add(vec![0], 100.0);
        let b = m.add(vec![1], 22.0);
        solved(&mut m);
        assert_eq!([m.rate(a), m.rate(b), m.rate(c)], [5.0, 22.0, 5.0]);
        // D joins link 0: A, C and D are refilled (3.33 each); B, behind
        // link 1's room, is not.
        let d = m.add(vec![0], 100.0);
        assert_eq!(m.solve(|f, _| assert_ne!(f, b, "B refilled")), 3);
        assert!(close(m.rate(a), 10.0 / 3.0) && m.rate(b) == 22.0);
        // C and D leave: A could have 10 on link 0 but fills link 1 at 8,
        // where B has more: B joins the part, and they share link 1 —
        // A 10, B 20.
        m.remove(c);
        m.remove(d);
        assert_eq!(solved(&mut m), 2);
        assert_eq!([m.rate(a), m.rate(b)], [10.0, 20.0]);
    }

    #[test]
    fn incremental_rates_are_those_from_scratch_and_fair() {
        // Random flows and classes come, go and change demand and count;
        // after each step the rates are those filled from scratch (a class
        // of n as n flows), and fair. Both kinds of change are taken: the
        // local ones (nothing refilled) and those that refill a part.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let (mut local, mut refilled) = (0, 0);
        for round in 0..40 {
            let nl = rng.random_range(1..12);
            let cap: Vec<f64> = (0..nl).map(|_| rng.random_range(1..50) as f64).collect();
            let mut m = MaxMin::new(cap.clone());
            // (flow, path, demand, count)
            let mut live: Vec<(FlowId, Vec<usize>, f64, usize)> = Vec::new();
            for _step in 0..80 {
                let r = rng.random_range(0..10);
                if live.is_empty() || r < 4 {
                    let mut path: Vec<usize> = (0..nl).filter(|_| rng.random_bool(0.3)).collect();
                    if path.is_empty() {
                        path.push(rng.random_range(0..nl));
                    }
                    let demand = if rng.random_bool(0.6) { rng.random_range(1..20) as f64 } else { 1e9 };
                    let count = if rng.random_bool(0.3) { rng.random_range(0..4) } else { 1 };
                    let id = m.add_class(path.clone(), demand, count as f64);
                    live.push((id, path, demand, count));
                } else if r < 6 {
                    let k = rng.random_range(0..live.len());
                    m.remove(live.swap_remove(k).0);
                } else if r < 8 {
                    let k = rng.random_range(0..live.len());
                    live[k].2 = rng.random_range(1..30) as f64;
                    m.set_demand(live[k].0, live[k].2);
                } else {
                    let k = rng.random_range(0..live.len());
                    live[k].3 = rng.random_range(0..5);
                    m.set_count(live[k].0, live[k].3 as f64);
                }
                if solved(&mut m) == 0 {
                    local += 1;
                } else {
                    refilled += 1;
                }
                let all: Vec<(Vec<usize>, f64)> = live.iter().flat_map(|x| std::iter::repeat_n((x.1.clone(), x.2), x.3)).collect();
                let want = from_scratch(&cap, &all);
                let mut k = 0;
                for x in &live {
                    if x.3 > 0 {
                        assert!(close(m.rate(x.0), want[k]), "round {round}: {} against {}", m.rate(x.0), want[k]);
                    }
                    k += x.3;
                }
                // Fair: no link over its capacity; every flow at its
                // demand or crossing a full link on which no flow has more.
                let mut load = vec![0.0; nl];
                for (x, &r) in all.iter().zip(&want) {
                    for &l in &x.0 {
                        load[l] += r;
                    }
                }
                for l in 0..nl {
                    assert!(load[l] <= cap[l] * (1.0 + 1e-9), "link {l} over capacity");
                }
                for (x, &r) in all.iter().zip(&want) {
                    let bottleneck = x.0.iter().any(|&l| {
                        close(load[l], cap[l]) && all.iter().zip(&want).filter(|(y, _)| y.0.contains(&l)).all(|(_, &s)| s <= r * (1.0 + 1e-9))
                    });
                    assert!(close(r, x.1) || bottleneck, "flow at {r} has no bottleneck");
                }
            }
        }
        assert!(local > 200 && refilled > 200, "{local} local changes, {refilled} refills");
    }
}
