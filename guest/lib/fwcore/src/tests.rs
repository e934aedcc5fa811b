use alloc::vec::Vec;

use crate::filter::{summary, Decision, Filter, Packet};
use crate::router::{Firewall, Port, Side, Stats, Verdict};
use crate::rules::{Action, Cidr, Dir, Proto, Rules};

const SAMPLE: &str = "
# a client's firewall
default deny
allow out tcp to 10.0.0.1 port 80,443,8000-8080
allow out udp port 53 rate 20/s   # DNS, not too much
allow in tcp from 10.0.0.1 sport 80
allow icmp
deny out from 10.200.0.0/16
";

#[test]
fn the_sample_parses_into_its_rules() {
    let r = Rules::parse(SAMPLE).unwrap();
    assert_eq!(r.default, Action::Deny);
    assert_eq!(r.rules.len(), 5);
    let a = &r.rules[0];
    assert_eq!((a.action, a.dir, a.proto, a.line), (Action::Allow, Some(Dir::Out), Some(Proto::Tcp), 4));
    assert_eq!(a.to, Some(Cidr { addr: [10, 0, 0, 1], len: 32 }));
    assert_eq!(a.dports, [(80, 80), (443, 443), (8000, 8080)]);
    assert_eq!(r.rules[1].rate, Some(20));
    assert_eq!(r.rules[3].dir, None, "no direction: both");
    assert_eq!(r.rules[4].from, Some(Cidr { addr: [10, 200, 0, 0], len: 16 }));
    assert_eq!(Rules::parse("").unwrap(), Rules { rules: Vec::new(), default: Action::Deny }, "nothing: everything denied");
}

#[test]
fn malformed_rules_are_refused_with_their_line_and_why() {
    let cases = [
        ("allow out tcp port 80\npermit all", 2, "a rule starts with allow or deny"),
        ("allow tcp to 10.0.0.256", 1, "no IPv4 address"),
        ("allow tcp to 10.0.0.1/33", 1, "a prefix length is 0 to 32"),
        ("allow tcp to 10.0.0.1/24", 1, "bits set past its /24 prefix"),
        ("allow tcp port 70000", 1, "no port"),
        ("allow tcp port 90-80", 1, "runs backwards"),
        ("allow port 80", 1, "ports need the protocol tcp or udp"),
        ("allow icmp port 80", 1, "ports need the protocol tcp or udp"),
        ("deny udp rate 5/s", 1, "not on deny"),
        ("allow udp rate 5", 1, "as N/s"),
        ("allow udp rate 0/s", 1, "1 to"),
        ("allow tcp udp", 1, "a protocol given twice"),
        ("allow in out", 1, "a direction given twice"),
        ("allow tcp to", 1, "'to' needs a value"),
        ("allow tcp everything", 1, "not part of the language"),
        ("default maybe", 1, "`default allow` or `default deny`"),
        ("default allow\ndefault deny", 2, "a second default"),
    ];
    for (text, line, why) in cases {
        let e = Rules::parse(text).expect_err(text);
        assert_eq!(e.line, line, "{text}: {e}");
        assert!(e.message.contains(why), "{text}: {e}");
    }
    let long = alloc::format!("allow tcp #{}", "x".repeat(600));
    assert!(Rules::parse(&long).unwrap_err().message.contains("longer than"));
    let many = "allow icmp\n".repeat(crate::rules::MAX_RULES + 1);
    assert!(Rules::parse(&many).unwrap_err().message.contains("more than"));
    // Binary garbage is refused, not a crash.
    let junk: Vec<u8> = (0..2000u32).map(|i| (i * 7919 % 251) as u8).collect();
    assert!(Rules::parse(&alloc::string::String::from_utf8_lossy(&junk)).is_err());
}

fn pkt(dir: Dir, proto: u8, src: [u8; 4], dst: [u8; 4], ports: Option<(u16, u16)>) -> Packet {
    Packet { dir, proto, src, dst, ports }
}

#[test]
fn the_first_matching_rule_decides_and_rates_hold() {
    let mut f = Filter::new(Rules::parse(SAMPLE).unwrap(), 0);
    let c = [10, 200, 3, 2];
    let web = [10, 0, 0, 1];
    assert_eq!(f.decide(&pkt(Dir::Out, 6, c, web, Some((40000, 443))), 0), Decision::Allowed(0));
    assert_eq!(f.decide(&pkt(Dir::Out, 6, c, web, Some((40000, 8080))), 0), Decision::Allowed(0));
    assert_eq!(f.decide(&pkt(Dir::Out, 6, c, web, Some((40000, 22))), 0), Decision::Denied(4), "past the allows, the deny of its subnet");
    assert_eq!(f.decide(&pkt(Dir::In, 6, web, c, Some((80, 40000))), 0), Decision::Allowed(2));
    assert_eq!(f.decide(&pkt(Dir::In, 6, web, c, Some((443, 40000))), 0), Decision::Default(Action::Deny));
    assert_eq!(f.decide(&pkt(Dir::In, 1, web, c, None), 0), Decision::Allowed(3));
    assert_eq!(f.decide(&pkt(Dir::Out, 6, c, web, None), 0), Decision::Denied(4), "a later fragment: no ports, no port rule");
    // 20 DNS packets a second, a burst of 20.
    let dns = pkt(Dir::Out, 17, c, [9, 9, 9, 9], Some((5000, 53)));
    let passed = (0..30).filter(|_| f.decide(&dns, 0).passes()).count();
    assert_eq!(passed, 20);
    assert_eq!(f.decide(&dns, 0), Decision::OverRate(1));
    assert!(f.decide(&dns, 50_000_000).passes(), "a twentieth of a second later: one more");
    assert!(!f.decide(&dns, 50_000_000).passes());
    assert_eq!((30..50).filter(|_| f.decide(&dns, 2_000_000_000).passes()).count(), 20, "refilled, to the burst");
    assert_eq!(f.hits[0], 2);
    assert_eq!(f.default_hits, 1);
}

const C_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xc];
const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x9];
const UP_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 5];
const LINK_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 1, 5];

fn fw(rules: &str) -> Firewall {
    let up = Side::new(UP_MAC, [10, 9, 0, 5], 16, Some([10, 9, 0, 1]));
    let client = Side::new(LINK_MAC, [10, 200, 3, 1], 30, None);
    Firewall::new(up, client, Filter::new(Rules::parse(rules).unwrap(), 0))
}

fn arp(op: u16, dst: [u8; 6], smac: [u8; 6], sip: [u8; 4], tip: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&smac);
    f.extend_from_slice(&[8, 6, 0, 1, 8, 0, 6, 4]);
    f.extend_from_slice(&op.to_be_bytes());
    f.extend_from_slice(&smac);
    f.extend_from_slice(&sip);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&tip);
    f.resize(60, 0);
    f
}

fn ip_sum(h: &[u8]) -> u16 {
    let mut s = 0u32;
    for c in h.chunks(2) {
        s += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// A TCP/IPv4 frame (header checksum right) from `src`:`sp` to `dst`:`dp`.
fn tcp(dst_mac: [u8; 6], src_mac: [u8; 6], src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16, ttl: u8) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[8, 0]);
    let mut ip = alloc::vec![0x45, 0, 0, 40, 0x12, 0x34, 0x40, 0, ttl, 6, 0, 0];
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let s = ip_sum(&ip);
    ip[10..12].copy_from_slice(&s.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&sp.to_be_bytes());
    f.extend_from_slice(&dp.to_be_bytes());
    f.resize(14 + 40, 0);
    f
}

#[test]
fn the_firewall_answers_arp_learns_neighbours_and_forwards_what_is_allowed() {
    let mut fw = fw("allow out tcp port 80\nallow in tcp sport 80");
    // The client asks for its gateway (the firewall's link address).
    let v = fw.inspect(Port::Client, &arp(1, [0xff; 6], C_MAC, [10, 200, 3, 2], [10, 200, 3, 1]), 0);
    let Verdict::Answer(a) = v else { panic!("{v:?}") };
    assert_eq!((&a[0..6], &a[6..12], &a[20..22], &a[28..32]), (&C_MAC[..], &LINK_MAC[..], &[0, 2][..], &[10, 200, 3, 1][..]));
    assert_eq!(fw.client.neighbour([10, 200, 3, 2]), Some(C_MAC));
    // Not for us: no answer. A sender outside the link's subnet: not learnt.
    assert_eq!(fw.inspect(Port::Client, &arp(1, [0xff; 6], C_MAC, [10, 200, 3, 2], [10, 200, 3, 3]), 0), Verdict::Drop);
    fw.inspect(Port::Uplink, &arp(1, [0xff; 6], [2, 0, 0, 0, 0, 0x66], [10, 99, 0, 1], [10, 9, 0, 5]), 0);
    assert_eq!(fw.uplink.neighbour([10, 99, 0, 1]), None);
    // The client's first packet out: the gateway is not known yet.
    let out = tcp(LINK_MAC, C_MAC, [10, 200, 3, 2], [10, 9, 0, 1], 40000, 80, 64);
    let Verdict::Resolve(q) = fw.inspect(Port::Client, &out, 0) else { panic!() };
    assert_eq!((&q[0..6], &q[28..32], &q[38..42]), (&[0xff; 6][..], &[10, 9, 0, 5][..], &[10, 9, 0, 1][..]), "asks for the gateway on the uplink");
    // The gateway answers; then packets go.
    assert_eq!(fw.inspect(Port::Uplink, &arp(2, UP_MAC, GW_MAC, [10, 9, 0, 1], [10, 9, 0, 5]), 0), Verdict::Drop);
    let v = fw.inspect(Port::Client, &out, 0);
    assert_eq!(v, Verdict::Forward { mac: GW_MAC });
    let mut copy = out.clone();
    fw.rewrite(Port::Uplink, GW_MAC, &mut copy);
    assert_eq!((&copy[0..6], &copy[6..12], copy[14 + 8]), (&GW_MAC[..], &UP_MAC[..], 63));
    assert_eq!(ip_sum(&copy[14..34]), 0, "the header checksum holds after the TTL change");
    assert_eq!(copy[34..], out[34..], "the rest untouched");
    // The answer comes back in.
    let back = tcp(UP_MAC, GW_MAC, [10, 9, 0, 1], [10, 200, 3, 2], 80, 40000, 1 + 1);
    assert_eq!(fw.inspect(Port::Uplink, &back, 0), Verdict::Forward { mac: C_MAC });
    // Denied, spoofed, expired, for the firewall itself, not IPv4.
    assert_eq!(fw.inspect(Port::Client, &tcp(LINK_MAC, C_MAC, [10, 200, 3, 2], [10, 9, 0, 1], 40000, 22, 64), 0), Verdict::Drop);
    assert_eq!(fw.inspect(Port::Client, &tcp(LINK_MAC, C_MAC, [10, 9, 0, 77], [10, 9, 0, 1], 40000, 80, 64), 0), Verdict::Drop);
    assert_eq!(fw.inspect(Port::Uplink, &tcp(UP_MAC, GW_MAC, [10, 9, 0, 1], [10, 201, 0, 2], 80, 40000, 64), 0), Verdict::Drop);
    assert_eq!(fw.inspect(Port::Client, &tcp(LINK_MAC, C_MAC, [10, 200, 3, 2], [10, 9, 0, 1], 40000, 80, 1), 0), Verdict::Drop);
    assert_eq!(fw.inspect(Port::Client, &tcp(LINK_MAC, C_MAC, [10, 200, 3, 2], [10, 9, 0, 5], 40000, 80, 64), 0), Verdict::Drop);
    let mut v6 = out.clone();
    v6[12..14].copy_from_slice(&[0x86, 0xdd]);
    assert_eq!(fw.inspect(Port::Client, &v6, 0), Verdict::Drop);
    assert_eq!(fw.inspect(Port::Client, &out[..30], 0), Verdict::Drop, "truncated");
    let want = Stats { forwarded_out: 1, forwarded_in: 1, denied: 1, spoofed: 2, expired: 1, local: 1, malformed: 2, unresolved: 1, arp_answered: 2, over_rate: 0 };
    assert_eq!(fw.stats, want);
}

#[test]
fn summaries_refuse_what_is_not_a_whole_ipv4_header() {
    let f = tcp(LINK_MAC, C_MAC, [10, 200, 3, 2], [10, 9, 0, 1], 1, 2, 64);
    assert_eq!(summary(&f, Dir::Out).unwrap().ports, Some((1, 2)));
    let mut bad = f.clone();
    bad[14] = 0x44; // IHL 16 bytes
    assert!(summary(&bad, Dir::Out).is_none());
    let mut long = f.clone();
    long[16..18].copy_from_slice(&2000u16.to_be_bytes()); // total past the frame
    assert!(summary(&long, Dir::Out).is_none());
}
