//! Forwarding between the two links of a personal firewall: the client's
//! (a point-to-point link, or a small subnet, that reaches only the
//! client) and the uplink (towards the gateway). The firewall is an IPv4
//! router for the client's subnet: it answers ARP for its own address on
//! each link, learns its neighbours from their ARP, and forwards what the
//! rules allow with its own MAC as source, the next hop's as destination,
//! and the TTL taken down by one. What it drops, it counts.

use alloc::vec::Vec;

use crate::filter::{summary, Decision, Filter, ETH};
use crate::rules::{Cidr, Dir};

/// One link's addresses and neighbours.
pub struct Side {
    pub mac: [u8; 6],
    pub ip: [u8; 4],
    /// The link's subnet.
    pub net: Cidr,
    /// Where frames leaving by this link go unless the destination is a
    /// neighbour on it (the uplink's gateway; none on the client's link).
    pub gateway: Option<[u8; 4]>,
    /// Neighbours learnt from their ARP (address, MAC), newest last.
    neighbours: Vec<([u8; 4], [u8; 6])>,
}

/// Most neighbours remembered a link.
pub const MAX_NEIGHBOURS: usize = 256;

impl Side {
    pub fn new(mac: [u8; 6], ip: [u8; 4], prefix: u8, gateway: Option<[u8; 4]>) -> Side {
        let net = Cidr { addr: (u32::from_be_bytes(ip) & wisp_abi::net::prefix_mask(prefix)).to_be_bytes(), len: prefix.min(32) };
        Side { mac, ip, net, gateway, neighbours: Vec::new() }
    }

    /// The MAC of neighbour `ip`, if known.
    pub fn neighbour(&self, ip: [u8; 4]) -> Option<[u8; 6]> {
        self.neighbours.iter().rev().find(|(a, _)| *a == ip).map(|(_, m)| *m)
    }

    fn learn(&mut self, ip: [u8; 4], mac: [u8; 6]) {
        if !self.net.contains(ip) || ip == self.ip || mac[0] & 1 != 0 {
            return;
        }
        self.neighbours.retain(|(a, _)| *a != ip);
        if self.neighbours.len() == MAX_NEIGHBOURS {
            self.neighbours.remove(0);
        }
        self.neighbours.push((ip, mac));
    }

    /// The next hop for `dst` leaving by this link.
    fn next_hop(&self, dst: [u8; 4]) -> Option<[u8; 4]> {
        if self.net.contains(dst) { Some(dst) } else { self.gateway }
    }
}

/// Which link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    Uplink,
    Client,
}

impl Port {
    pub fn other(self) -> Port {
        match self {
            Port::Uplink => Port::Client,
            Port::Client => Port::Uplink,
        }
    }
}

/// What to do with a frame that came in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send it out of the other link, rewritten by [`Firewall::rewrite`]
    /// for next hop `mac`.
    Forward { mac: [u8; 6] },
    /// Send this frame back out of the link it came from (an ARP answer).
    Answer(Vec<u8>),
    /// The next hop's MAC is unknown: the frame is dropped and this ARP
    /// request goes out of the other link.
    Resolve(Vec<u8>),
    /// Dropped (counted in [`Stats`]).
    Drop,
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub forwarded_out: u64,
    pub forwarded_in: u64,
    /// Denied by a rule or the default.
    pub denied: u64,
    /// Allowed by a rule but past its rate.
    pub over_rate: u64,
    /// From the client with a source outside its subnet, or from the
    /// uplink to an address outside it.
    pub spoofed: u64,
    /// Not IPv4 or ARP, or malformed.
    pub malformed: u64,
    /// TTL ran out.
    pub expired: u64,
    /// For the firewall itself (not ARP).
    pub local: u64,
    /// Dropped while the next hop was being resolved.
    pub unresolved: u64,
    pub arp_answered: u64,
}

/// A personal firewall: two links and a rule set.
pub struct Firewall {
    pub uplink: Side,
    pub client: Side,
    pub filter: Filter,
    pub stats: Stats,
}

const ARP: [u8; 2] = [0x08, 0x06];

/// An ARP packet in an Ethernet frame (60 bytes, the shortest frame).
fn arp_frame(op: u16, dst_mac: [u8; 6], src_mac: [u8; 6], sender_ip: [u8; 4], target_mac: [u8; 6], target_ip: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&ARP);
    f.extend_from_slice(&[0x00, 0x01, 0x08, 0x00, 6, 4]);
    f.extend_from_slice(&op.to_be_bytes());
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&sender_ip);
    f.extend_from_slice(&target_mac);
    f.extend_from_slice(&target_ip);
    f.resize(60, 0);
    f
}

impl Firewall {
    pub fn new(uplink: Side, client: Side, filter: Filter) -> Firewall {
        Firewall { uplink, client, filter, stats: Stats::default() }
    }

    pub fn side(&self, p: Port) -> &Side {
        match p {
            Port::Uplink => &self.uplink,
            Port::Client => &self.client,
        }
    }

    fn side_mut(&mut self, p: Port) -> &mut Side {
        match p {
            Port::Uplink => &mut self.uplink,
            Port::Client => &mut self.client,
        }
    }

    /// The uplink's gateway while its MAC is not known yet (it is asked
    /// for until it is).
    pub fn gateway_unknown(&self) -> Option<[u8; 4]> {
        self.uplink.gateway.filter(|g| self.uplink.neighbour(*g).is_none())
    }

    /// An ARP request for `ip` out of link `p`.
    pub fn arp_request(&self, p: Port, ip: [u8; 4]) -> Vec<u8> {
        let s = self.side(p);
        arp_frame(1, [0xff; 6], s.mac, s.ip, [0; 6], ip)
    }

    /// Decide on `frame`, which came in by link `from`, at `now_ns`.
    pub fn inspect(&mut self, from: Port, frame: &[u8], now_ns: u64) -> Verdict {
        if frame.len() >= 42 && frame[12..14] == ARP {
            return self.arp(from, frame);
        }
        let dir = if from == Port::Client { Dir::Out } else { Dir::In };
        let Some(p) = summary(frame, dir) else {
            self.stats.malformed += 1;
            return Verdict::Drop;
        };
        let (this, client_net) = (self.side(from), self.client.net);
        if p.dst == this.ip || p.dst == self.side(from.other()).ip {
            self.stats.local += 1;
            return Verdict::Drop;
        }
        // The client speaks only from its subnet, and only its subnet is
        // reached through it.
        let spoofed = match from {
            Port::Client => !client_net.contains(p.src) || p.src == self.client.ip,
            Port::Uplink => !client_net.contains(p.dst),
        };
        if spoofed {
            self.stats.spoofed += 1;
            return Verdict::Drop;
        }
        if frame[ETH + 8] <= 1 {
            self.stats.expired += 1;
            return Verdict::Drop;
        }
        match self.filter.decide(&p, now_ns) {
            d if d.passes() => {}
            Decision::OverRate(_) => {
                self.stats.over_rate += 1;
                return Verdict::Drop;
            }
            _ => {
                self.stats.denied += 1;
                return Verdict::Drop;
            }
        }
        let out = self.side(from.other());
        let Some(hop) = out.next_hop(p.dst) else {
            self.stats.unresolved += 1;
            return Verdict::Drop;
        };
        match out.neighbour(hop) {
            Some(mac) => {
                match from {
                    Port::Client => self.stats.forwarded_out += 1,
                    Port::Uplink => self.stats.forwarded_in += 1,
                }
                Verdict::Forward { mac }
            }
            None => {
                self.stats.unresolved += 1;
                Verdict::Resolve(self.arp_request(from.other(), hop))
            }
        }
    }

    fn arp(&mut self, from: Port, f: &[u8]) -> Verdict {
        if f[14..20] != [0x00, 0x01, 0x08, 0x00, 6, 4] {
            self.stats.malformed += 1;
            return Verdict::Drop;
        }
        let op = u16::from_be_bytes([f[20], f[21]]);
        let sender_mac: [u8; 6] = f[22..28].try_into().unwrap_or_default();
        let sender_ip: [u8; 4] = f[28..32].try_into().unwrap_or_default();
        let target_ip: [u8; 4] = f[38..42].try_into().unwrap_or_default();
        let side = self.side_mut(from);
        // A request from a neighbour tells its address too (RFC 826).
        side.learn(sender_ip, sender_mac);
        if op == 1 && target_ip == side.ip && sender_mac[0] & 1 == 0 {
            let answer = arp_frame(2, sender_mac, side.mac, side.ip, sender_mac, sender_ip);
            self.stats.arp_answered += 1;
            return Verdict::Answer(answer);
        }
        Verdict::Drop
    }

    /// Rewrite a copy of a frame [`inspect`](Self::inspect) said to forward
    /// out of link `to` towards `mac`: the MACs, and the TTL down by one
    /// with the header checksum mended (RFC 1624).
    pub fn rewrite(&self, to: Port, mac: [u8; 6], frame: &mut [u8]) {
        frame[0..6].copy_from_slice(&mac);
        frame[6..12].copy_from_slice(&self.side(to).mac);
        let ip = &mut frame[ETH..];
        let old = u16::from_be_bytes([ip[8], ip[9]]);
        ip[8] -= 1;
        let new = u16::from_be_bytes([ip[8], ip[9]]);
        let hc = u16::from_be_bytes([ip[10], ip[11]]);
        let mut sum = (!hc as u32) + (!old as u32) + new as u32;
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    }
}
