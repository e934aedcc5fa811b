//! Deciding on a packet: its summary from the frame, the first rule that
//! matches, and the rule's rate (a token bucket a rule, in integers: the
//! guest has no FPU).

use alloc::vec::Vec;

use crate::rules::{Action, Dir, Rule, Rules};

/// What the rules look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    pub dir: Dir,
    /// IP protocol number.
    pub proto: u8,
    pub src: [u8; 4],
    pub dst: [u8; 4],
    /// Source and destination ports (TCP or UDP, first fragment only).
    pub ports: Option<(u16, u16)>,
}

/// Ethernet header bytes.
pub const ETH: usize = 14;

/// The summary of the IPv4 datagram in Ethernet `frame` going `dir`, if it
/// is a well-formed one (header complete, length consistent).
pub fn summary(frame: &[u8], dir: Dir) -> Option<Packet> {
    if frame.len() < ETH + 20 || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &frame[ETH..];
    let ihl = (ip[0] & 0xf) as usize * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    if ip[0] >> 4 != 4 || ihl < 20 || total < ihl || total > ip.len() {
        return None;
    }
    let proto = ip[9];
    let frag = u16::from_be_bytes([ip[6], ip[7]]);
    let first = frag & 0x1fff == 0;
    let ports = match proto {
        6 | 17 if first && total >= ihl + 4 => Some((u16::from_be_bytes([ip[ihl], ip[ihl + 1]]), u16::from_be_bytes([ip[ihl + 2], ip[ihl + 3]]))),
        _ => None,
    };
    Some(Packet { dir, proto, src: [ip[12], ip[13], ip[14], ip[15]], dst: [ip[16], ip[17], ip[18], ip[19]], ports })
}

fn in_ranges(p: u16, ranges: &[(u16, u16)]) -> bool {
    ranges.is_empty() || ranges.iter().any(|&(a, b)| a <= p && p <= b)
}

/// Whether `r` matches `p` (its rate aside).
pub fn matches(r: &Rule, p: &Packet) -> bool {
    if r.dir.is_some_and(|d| d != p.dir) || r.proto.is_some_and(|x| x.number() != p.proto) {
        return false;
    }
    if r.from.is_some_and(|c| !c.contains(p.src)) || r.to.is_some_and(|c| !c.contains(p.dst)) {
        return false;
    }
    if r.dports.is_empty() && r.sports.is_empty() {
        return true;
    }
    match p.ports {
        Some((s, d)) => in_ranges(d, &r.dports) && in_ranges(s, &r.sports),
        None => false,
    }
}

/// A token bucket of `rate` packets a second and as many of burst, kept in
/// billionths of a packet.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    rate: u64,
    tokens: u64,
    last_ns: u64,
}

const NANO: u64 = 1_000_000_000;

impl Bucket {
    fn new(rate: u32, now_ns: u64) -> Bucket {
        Bucket { rate: rate as u64, tokens: rate as u64 * NANO, last_ns: now_ns }
    }

    fn take(&mut self, now_ns: u64) -> bool {
        let cap = self.rate * NANO;
        // At most a second's refill at once: no overflow, and a full bucket
        // is reached by then anyway.
        let dt = now_ns.saturating_sub(self.last_ns).min(NANO);
        self.last_ns = self.last_ns.max(now_ns);
        self.tokens = (self.tokens + dt * self.rate).min(cap);
        if self.tokens >= NANO {
            self.tokens -= NANO;
            true
        } else {
            false
        }
    }
}

/// How a packet was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Rule `n` (0-based) allowed it.
    Allowed(usize),
    /// Rule `n` denied it.
    Denied(usize),
    /// Rule `n` allows it, but past its rate.
    OverRate(usize),
    /// No rule matched: the default.
    Default(Action),
}

impl Decision {
    pub fn passes(self) -> bool {
        matches!(self, Decision::Allowed(_) | Decision::Default(Action::Allow))
    }
}

/// A rule set with its buckets and counters.
pub struct Filter {
    pub rules: Rules,
    buckets: Vec<Option<Bucket>>,
    /// Packets each rule decided (the same order as the rules).
    pub hits: Vec<u64>,
    /// Packets the default decided.
    pub default_hits: u64,
}

impl Filter {
    pub fn new(rules: Rules, now_ns: u64) -> Filter {
        let buckets = rules.rules.iter().map(|r| r.rate.map(|n| Bucket::new(n, now_ns))).collect();
        let hits = alloc::vec![0; rules.rules.len()];
        Filter { rules, buckets, hits, default_hits: 0 }
    }

    /// Decide on `p` at `now_ns` (monotonic).
    pub fn decide(&mut self, p: &Packet, now_ns: u64) -> Decision {
        for (i, r) in self.rules.rules.iter().enumerate() {
            if !matches(r, p) {
                continue;
            }
            self.hits[i] += 1;
            if r.action == Action::Deny {
                return Decision::Denied(i);
            }
            let within = self.buckets[i].as_mut().is_none_or(|b| b.take(now_ns));
            return if within { Decision::Allowed(i) } else { Decision::OverRate(i) };
        }
        self.default_hits += 1;
        Decision::Default(self.rules.default)
    }
}
