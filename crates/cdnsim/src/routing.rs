//! Valley-free paths (Gao–Rexford): traffic climbs from customers to
//! providers, crosses at most one peering link, then descends to
//! customers — no AS carries traffic between two of its providers or
//! peers for free. [`Routes::from`] finds, from one AS to every other, the
//! shortest such path (fewest AS hops; ties go to the lower-numbered link,
//! so runs are deterministic): a breadth-first search over (AS, phase),
//! the phase being "may still go up" or "only down from here".

use std::collections::VecDeque;

use crate::topology::{Dir, Topology};

/// Shortest valley-free paths from one AS.
pub struct Routes {
    pub source: usize,
    /// Per AS and phase: (previous AS, phase there, link), for the path's
    /// last hop; `usize::MAX` where unreached.
    prev: Vec<[(usize, u8, usize); 2]>,
    /// Per AS: the phase of its shortest path (`None`: unreachable).
    best: Vec<Option<u8>>,
    /// Per AS: its shortest path's hops.
    hops: Vec<u32>,
}

const UP: u8 = 0;
const DOWN: u8 = 1;
const NONE: (usize, u8, usize) = (usize::MAX, 0, usize::MAX);

impl Routes {
    /// Paths from AS `source` (an index of `t`) to every AS.
    pub fn from(t: &Topology, source: usize) -> Routes {
        let n = t.ases.len();
        let mut prev = vec![[NONE; 2]; n];
        let mut dist = vec![[u32::MAX; 2]; n];
        let mut q = VecDeque::new();
        dist[source][UP as usize] = 0;
        q.push_back((source, UP));
        while let Some((v, phase)) = q.pop_front() {
            let d = dist[v][phase as usize];
            let mut edges: Vec<&(usize, usize, Dir)> = t.adj[v].iter().collect();
            edges.sort_by_key(|e| e.1);
            for &&(w, l, dir) in &edges {
                let next = match (phase, dir) {
                    (UP, Dir::Up) => UP,
                    (UP, Dir::Across) | (_, Dir::Down) => DOWN,
                    _ => continue,
                };
                if dist[w][next as usize] == u32::MAX {
                    dist[w][next as usize] = d + 1;
                    prev[w][next as usize] = (v, phase, l);
                    q.push_back((w, next));
                }
            }
        }
        let best = (0..n)
            .map(|v| match (dist[v][0], dist[v][1]) {
                (u32::MAX, u32::MAX) => None,
                (a, b) if a <= b => Some(UP),
                _ => Some(DOWN),
            })
            .collect();
        let hops = dist.iter().map(|d| d[0].min(d[1])).collect();
        Routes { source, prev, best, hops }
    }

    /// The hops of the shortest valley-free path to AS `dest` (a valley-free
    /// path read backwards is one too: the same count from `dest`).
    pub fn hops(&self, dest: usize) -> Option<usize> {
        let h = self.hops[dest];
        (h != u32::MAX).then_some(h as usize)
    }

    /// The links of the path to AS `dest`, from the source on (empty for
    /// the source itself); `None` if no valley-free path reaches it.
    pub fn path(&self, dest: usize) -> Option<Vec<usize>> {
        let mut phase = self.best[dest]?;
        let mut v = dest;
        let mut links = Vec::new();
        while v != self.source || phase != UP {
            let (p, pp, l) = self.prev[v][phase as usize];
            links.push(l);
            v = p;
            phase = pp;
        }
        links.reverse();
        Some(links)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{Kind, Speeds};

    /// The ASes a path of links visits, from `from`.
    fn hops(t: &Topology, from: usize, links: &[usize]) -> Vec<u32> {
        let mut v = from;
        let mut out = vec![t.ases[v].asn];
        for &l in links {
            let link = &t.links[l];
            v = if link.a == v { link.b } else { link.a };
            out.push(t.ases[v].asn);
        }
        out
    }

    /// Whether a path is valley-free: ups, at most one peering, downs.
    fn valley_free(t: &Topology, from: usize, links: &[usize]) -> bool {
        let mut v = from;
        let mut descending = false;
        for &l in links {
            let link = &t.links[l];
            let up = link.kind == Kind::Transit && link.b == v;
            let peer = link.kind == Kind::Peer;
            if descending && (up || peer) {
                return false;
            }
            descending |= !up;
            v = if link.a == v { link.b } else { link.a };
        }
        true
    }

    #[test]
    fn paths_go_up_across_once_and_down() {
        // 1 and 2 peer; 1 serves 10 and 11, 2 serves 20; 11 is also a
        // customer of 2 (multihomed); 30 is a provider of 10 and 20.
        let t = Topology::parse("1|2|0\n1|10|-1\n1|11|-1\n2|20|-1\n2|11|-1\n30|10|-1\n30|20|-1\n", Speeds::default()).unwrap();
        let at = |asn| t.find(asn).unwrap();
        let r = Routes::from(&t, at(10));
        // 10 -> 20: up to 30 and down (or up to 1, across to 2, down: longer).
        assert_eq!(hops(&t, at(10), &r.path(at(20)).unwrap()), [10, 30, 20]);
        // 10 -> 11 through 1; never through 30 and ... (no path via 11's other provider).
        assert_eq!(hops(&t, at(10), &r.path(at(11)).unwrap()), [10, 1, 11]);
        // 10 -> 2: up to 1 and across (the valley 10-30-20-2 is not allowed).
        assert_eq!(hops(&t, at(10), &r.path(at(2)).unwrap()), [10, 1, 2]);
        // From 11: to 20 over its provider 2 (down from 2).
        let r11 = Routes::from(&t, at(11));
        assert_eq!(hops(&t, at(11), &r11.path(at(20)).unwrap()), [11, 2, 20]);
        // From 20 to 30: 30 is 20's provider.
        assert_eq!(hops(&t, at(20), &Routes::from(&t, at(20)).path(at(30)).unwrap()), [20, 30]);
        assert_eq!(r.path(at(10)).unwrap(), Vec::<usize>::new());
        // Hop counts, and the same both ways.
        assert_eq!((r.hops(at(20)), r.hops(at(2)), r.hops(at(10))), (Some(2), Some(2), Some(0)));
        for a in 0..t.ases.len() {
            for b in 0..t.ases.len() {
                assert_eq!(Routes::from(&t, a).hops(b), Routes::from(&t, b).hops(a));
            }
        }
    }

    #[test]
    fn a_valley_is_never_taken_even_when_shorter_and_some_ases_are_unreachable() {
        // 10 and 20 are both customers of 30 and of nobody else; 10 peers
        // with 40, which has a customer 41. From 41: up to 40, across to
        // 10, then only down: 30 (10's provider) is out of reach, and so
        // is 20.
        let t = Topology::parse("30|10|-1\n30|20|-1\n10|40|0\n40|41|-1\n", Speeds::default()).unwrap();
        let at = |asn| t.find(asn).unwrap();
        let r = Routes::from(&t, at(41));
        assert_eq!(hops(&t, at(41), &r.path(at(10)).unwrap()), [41, 40, 10]);
        assert_eq!(r.path(at(30)), None);
        assert_eq!(r.path(at(20)), None);
    }

    #[test]
    fn every_path_in_a_generated_graph_is_valley_free_and_reaches_every_as() {
        let t = crate::gen::generate(400, 3);
        for src in t.with_role(crate::topology::Role::Content).take(5) {
            let r = Routes::from(&t, src);
            let mut reached = 0;
            for dst in 0..t.ases.len() {
                if let Some(p) = r.path(dst) {
                    assert!(valley_free(&t, src, &p), "{:?}", hops(&t, src, &p));
                    reached += 1;
                }
            }
            // A content AS buys transit from a tier-1 or mid-level AS, whose
            // tier-1 providers peer in a full mesh: every AS is reached.
            assert_eq!(reached, t.ases.len());
        }
    }
}
