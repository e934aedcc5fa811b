//! Synthetic AS graphs: the model of Elmokashfi, Kvalbein and Dovrolis
//! ("On the Scalability of BGP: The Role of Topology Growth", IEEE JSAC
//! 2010) as networkx's `random_internet_as_graph` implements it, written
//! here because no AS data set ships in a package on this machine and the
//! simulator is Rust. Tier-1 ASes (T, 4–6, a full mesh of peers) in five
//! regions; mid-level transit ASes (M, 15 %), content providers (CP, 5 %)
//! and customers (C, the rest) join in that order, each buying transit
//! from T or M ASes of its region(s), picked with preferential attachment
//! on degree; then peering among M ASes (preferential on peering degree),
//! between CP and M ASes and among CP ASes (uniform within a region). The
//! averages grow with `n` as in the paper. Roles: T and M are transit, CP
//! content, C access. Deterministic for a seed (ChaCha8).

use std::collections::HashSet;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::topology::{Kind, Role, Speeds, Topology};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tier {
    T,
    M,
    Cp,
    C,
}

struct Gen {
    rng: ChaCha8Rng,
    tier: Vec<Tier>,
    /// Region membership bits (five regions).
    regions: Vec<u8>,
    degree: Vec<u32>,
    peers: Vec<u32>,
    /// Direct and inherited providers, and customers (as networkx keeps them).
    providers: Vec<HashSet<usize>>,
    customers: Vec<HashSet<usize>>,
    neighbours: Vec<HashSet<usize>>,
    /// (provider, customer) and (peer, peer) links in the order made.
    links: Vec<(usize, usize, Kind)>,
}

/// A random integer of minimum `a` and mean `m` (networkx's
/// `uniform_int_from_avg`).
fn uniform_int_from_avg(rng: &mut ChaCha8Rng, a: f64, m: f64) -> usize {
    let b = 2.0 * m - a;
    let p = (b - b.floor()) / 2.0;
    let x1 = (rng.random::<f64>() * (b.floor() - a) + a).round();
    let x2 = if rng.random::<f64>() < p { 1.0 } else { 0.0 };
    (x1 + x2) as usize
}

impl Gen {
    fn add(&mut self, tier: Tier) -> usize {
        self.tier.push(tier);
        self.regions.push(0);
        self.degree.push(0);
        self.peers.push(0);
        self.providers.push(HashSet::new());
        self.customers.push(HashSet::new());
        self.neighbours.push(HashSet::new());
        self.tier.len() - 1
    }

    fn link(&mut self, a: usize, b: usize, kind: Kind) {
        self.links.push((a, b, kind));
        self.degree[a] += 1;
        self.degree[b] += 1;
        self.neighbours[a].insert(b);
        self.neighbours[b].insert(a);
    }

    /// One of `options` with probability proportional to `weight`
    /// (uniform if all weigh 0); `options` sorted for determinism.
    fn pick(&mut self, options: &[usize], weight: impl Fn(&Gen, usize) -> u32) -> usize {
        let total: u64 = options.iter().map(|&o| weight(self, o) as u64).sum();
        if total == 0 {
            return options[self.rng.random_range(0..options.len())];
        }
        let mut v = self.rng.random::<f64>() * total as f64;
        for &o in options {
            v -= weight(self, o) as f64;
            if v <= 0.0 {
                return o;
            }
        }
        options[options.len() - 1]
    }

    /// A new AS of `tier` and its transit links (networkx's `add_node`).
    fn add_node(&mut self, tier: Tier, two_regions: f64, avg_deg: f64, t_prob: f64) {
        let i = self.add(tier);
        let regs = if self.rng.random::<f64>() < two_regions { 2 } else { 1 };
        let mut all: Vec<u8> = (0..5).collect();
        let mut bits = 0u8;
        for _ in 0..regs {
            let k = self.rng.random_range(0..all.len());
            bits |= 1 << all.remove(k);
        }
        self.regions[i] = bits;
        let in_region = |g: &Gen, j: usize, t: Tier| j != i && g.tier[j] == t && g.regions[j] & bits != 0;
        let mut t_opts: Vec<usize> = (0..i).filter(|&j| in_region(self, j, Tier::T)).collect();
        let mut m_opts: Vec<usize> = (0..i).filter(|&j| in_region(self, j, Tier::M)).collect();
        let edges = uniform_int_from_avg(&mut self.rng, 1.0, avg_deg);
        let mut d = 0;
        while d < edges && !(t_opts.is_empty() && m_opts.is_empty()) {
            let to_t = m_opts.is_empty() || (!t_opts.is_empty() && self.rng.random::<f64>() < t_prob);
            let opts = if to_t { &mut t_opts } else { &mut m_opts };
            let list = opts.clone();
            let j = self.pick(&list, |g, o| g.degree[o]);
            opts.retain(|&o| o != j);
            self.link(j, i, Kind::Transit);
            // (networkx's add_customer: j's providers become i's too.)
            self.customers[j].insert(i);
            self.providers[i].insert(j);
            for z in self.providers[j].clone() {
                self.customers[z].insert(i);
                self.providers[i].insert(z);
            }
            d += 1;
        }
    }

    /// Peering links from every AS of `from` (networkx's add_peering_links).
    fn peerings(&mut self, from: Tier, to: Tier, avg: f64) {
        let ases: Vec<usize> = (0..self.tier.len()).filter(|&i| self.tier[i] == from).collect();
        for i in ases {
            let n = uniform_int_from_avg(&mut self.rng, 0.0, avg);
            for _ in 0..n {
                let opts: Vec<usize> = (0..self.tier.len())
                    .filter(|&j| {
                        j != i
                            && self.tier[j] == to
                            && !self.providers[i].contains(&j)
                            && !self.neighbours[i].contains(&j)
                            && (from == Tier::Cp || !self.customers[i].contains(&j))
                            && (from == Tier::M || self.regions[j] & self.regions[i] != 0)
                    })
                    .collect();
                if opts.is_empty() {
                    continue;
                }
                let j = if from == Tier::M { self.pick(&opts, |g, o| g.peers[o]) } else { opts[self.rng.random_range(0..opts.len())] };
                self.link(i, j, Kind::Peer);
                self.peers[i] += 1;
                self.peers[j] += 1;
            }
        }
    }
}

/// A synthetic AS graph of `n` ASes (at least 5) for `seed`.
pub fn generate(n: usize, seed: u64) -> Topology {
    let mut g = Gen {
        rng: ChaCha8Rng::seed_from_u64(seed),
        tier: Vec::new(),
        regions: Vec::new(),
        degree: Vec::new(),
        peers: Vec::new(),
        providers: Vec::new(),
        customers: Vec::new(),
        neighbours: Vec::new(),
        links: Vec::new(),
    };
    let nf = n as f64;
    let n_t = n.min((g.rng.random::<f64>() * 2.0 + 4.0).round() as usize);
    let n_m = (0.15 * nf).round() as usize;
    let n_cp = (0.05 * nf).round() as usize;
    let n_c = n.saturating_sub(n_t + n_m + n_cp);
    for i in 0..n_t {
        g.add(Tier::T);
        g.regions[i] = 0b11111;
        for j in 0..i {
            g.link(j, i, Kind::Peer);
        }
    }
    for _ in 0..n_m {
        g.add_node(Tier::M, 0.2, 2.0 + 2.5 * nf / 10000.0, 0.375);
    }
    for _ in 0..n_cp {
        g.add_node(Tier::Cp, 0.05, 2.0 + 1.5 * nf / 10000.0, 0.375);
    }
    for _ in 0..n_c {
        g.add_node(Tier::C, 0.0, 1.0 + 5.0 * nf / 100000.0, 0.125);
    }
    g.peerings(Tier::M, Tier::M, 1.0 + 2.0 * nf / 10000.0);
    g.peerings(Tier::Cp, Tier::M, 0.2 + 2.0 * nf / 10000.0);
    g.peerings(Tier::Cp, Tier::Cp, 0.05 + 2.0 * nf / 100000.0);
    let mut text = String::new();
    for (i, t) in g.tier.iter().enumerate() {
        let role = match t {
            Tier::T | Tier::M => Role::Transit,
            Tier::Cp => Role::Content,
            Tier::C => Role::Access,
        };
        text += &format!("# role {} {}\n", i + 1, role.name());
    }
    for &(a, b, kind) in &g.links {
        text += &format!("{}|{}|{}\n", a + 1, b + 1, if kind == Kind::Transit { -1 } else { 0 });
    }
    Topology::parse(&text, Speeds::default()).expect("the generator writes what the reader takes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Dir;

    #[test]
    fn the_model_holds_its_tiers_and_the_same_seed_gives_the_same_graph() {
        let t = generate(1000, 7);
        assert_eq!(t.ases.len(), 1000, "every AS has a link");
        let count = |r| t.with_role(r).count();
        assert_eq!(count(Role::Content), 50);
        assert!((150 + 4..=150 + 6).contains(&count(Role::Transit)), "{}", count(Role::Transit));
        // Every non-tier-1 AS buys transit from at least one provider.
        let tier1 = t.ases.iter().take_while(|a| t.adj[t.find(a.asn).unwrap()].iter().all(|&(_, _, d)| d != Dir::Up)).count();
        assert!((4..=6).contains(&tier1));
        for i in tier1..t.ases.len() {
            assert!(t.adj[i].iter().any(|&(_, _, d)| d == Dir::Up), "AS {} has no provider", t.ases[i].asn);
        }
        // No provider loops: providers join before their customers.
        for l in t.links.iter().filter(|l| l.kind == Kind::Transit) {
            assert!(l.a < l.b);
        }
        assert_eq!(generate(1000, 7).write(), t.write());
        assert_ne!(generate(1000, 8).write(), t.write());
        // Access ASes are multihomed now and then, and peering exists.
        let multi = t.with_role(Role::Access).filter(|&i| t.adj[i].iter().filter(|e| e.2 == Dir::Up).count() > 1).count();
        assert!(multi > 0);
        assert!(t.links.iter().filter(|l| l.kind == Kind::Peer).count() > 15);
    }

    #[test]
    fn country_scales_from_100_to_15000_ases() {
        for n in [100, 15_000] {
            let t = generate(n, 1);
            assert_eq!(t.ases.len(), n);
            assert!(t.with_role(Role::Content).count() > 0);
        }
    }
}
