//! The rules language (`docs/usecases.md`, "Personal firewalls"): one rule
//! a line, `#` to the line's end a comment, blank lines ignored.
//!
//! ```text
//! default deny                       # what no rule matches gets (deny if absent)
//! allow out tcp to 10.0.0.1 port 80,443
//! allow out udp port 53 rate 20/s    # at most 20 packets a second, the rest dropped
//! allow in tcp from 10.0.0.1 sport 80
//! allow icmp                         # both ways
//! deny out from 10.200.0.0/16
//! ```
//!
//! A rule: `allow` or `deny`, then in any order at most once each: a
//! direction (`out`: from the client, `in`: to it; both if absent), a
//! protocol (`tcp`, `udp`, `icmp`, `any`), `from CIDR`, `to CIDR`, `port
//! PORTS` (destination), `sport PORTS` (source) — PORTS a list of ports
//! and ranges, `80,443,8000-8080`, with `tcp` or `udp` only — and, on an
//! `allow`, `rate N/s` (packets a second, a burst of N). The first rule a
//! packet matches decides. A datagram's later fragments carry no ports:
//! only rules without ports match them.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use wisp_abi::net::{in_prefix, prefix_mask};

/// Most rules in a set.
pub const MAX_RULES: usize = 1024;
/// Longest line.
pub const MAX_LINE: usize = 512;
/// Most port ranges in one rule.
pub const MAX_PORTS: usize = 32;
/// Highest rate (packets a second).
pub const MAX_RATE: u32 = 10_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

/// Which way a packet goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// From the client.
    Out,
    /// To the client.
    In,
}

/// IP protocol numbers the language names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
    Icmp,
}

impl Proto {
    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
            Proto::Icmp => 1,
        }
    }
}

/// An IPv4 prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub addr: [u8; 4],
    pub len: u8,
}

impl Cidr {
    pub fn contains(&self, a: [u8; 4]) -> bool {
        in_prefix(a, (self.addr, self.len))
    }

    /// `A.B.C.D` or `A.B.C.D/N` (no host bits set past the prefix).
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, len) = match s.split_once('/') {
            Some((a, l)) => (a, l.parse::<u8>().ok().filter(|l| *l <= 32).ok_or_else(|| format!("'{s}': a prefix length is 0 to 32"))?),
            None => (s, 32),
        };
        let addr = parse_ipv4(a).ok_or_else(|| format!("'{s}' is no IPv4 address"))?;
        let c = Cidr { addr, len };
        if u32::from_be_bytes(addr) & !prefix_mask(len) != 0 {
            return Err(format!("'{s}' has bits set past its /{len} prefix"));
        }
        Ok(c)
    }
}

/// Dotted-quad IPv4 address.
pub fn parse_ipv4(s: &str) -> Option<[u8; 4]> {
    let mut out = [0u8; 4];
    let mut parts = s.split('.');
    for o in out.iter_mut() {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// A rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub action: Action,
    pub dir: Option<Dir>,
    pub proto: Option<Proto>,
    pub from: Option<Cidr>,
    pub to: Option<Cidr>,
    /// Destination port ranges (inclusive); empty: any.
    pub dports: Vec<(u16, u16)>,
    pub sports: Vec<(u16, u16)>,
    /// Packets a second (and the burst).
    pub rate: Option<u32>,
    /// Its line in the text (1-based), for messages and counters.
    pub line: usize,
}

/// A parsed rule set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    pub rules: Vec<Rule>,
    pub default: Action,
}

/// Why a text is not a rule set: the line (1-based) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl core::fmt::Display for ParseError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

fn ports(s: &str) -> Result<Vec<(u16, u16)>, String> {
    let mut out = Vec::new();
    for p in s.split(',') {
        let one = |x: &str| x.parse::<u16>().map_err(|_| format!("'{x}' is no port (0 to 65535)"));
        let r = match p.split_once('-') {
            Some((a, b)) => (one(a)?, one(b)?),
            None => (one(p)?, one(p)?),
        };
        if r.0 > r.1 {
            return Err(format!("port range '{p}' runs backwards"));
        }
        out.push(r);
        if out.len() > MAX_PORTS {
            return Err(format!("more than {MAX_PORTS} port ranges in one rule"));
        }
    }
    Ok(out)
}

fn rate(s: &str) -> Result<u32, String> {
    let n = s.strip_suffix("/s").ok_or_else(|| format!("rate '{s}': packets a second, as N/s"))?;
    match n.parse::<u32>() {
        Ok(n) if (1..=MAX_RATE).contains(&n) => Ok(n),
        _ => Err(format!("rate '{s}': 1 to {MAX_RATE} packets a second")),
    }
}

fn rule(words: &[&str], line: usize) -> Result<Rule, String> {
    let action = match words[0] {
        "allow" => Action::Allow,
        "deny" => Action::Deny,
        w => return Err(format!("'{w}': a rule starts with allow or deny (or the line is `default allow|deny`)")),
    };
    let mut r = Rule { action, dir: None, proto: None, from: None, to: None, dports: Vec::new(), sports: Vec::new(), rate: None, line };
    let mut any_proto = false;
    let mut i = 1;
    let once = |set: bool, what: &str| if set { Err(format!("{what} given twice")) } else { Ok(()) };
    while i < words.len() {
        let w = words[i];
        let arg = || words.get(i + 1).copied().ok_or_else(|| format!("'{w}' needs a value after it"));
        match w {
            "in" | "out" => {
                once(r.dir.is_some(), "a direction")?;
                r.dir = Some(if w == "in" { Dir::In } else { Dir::Out });
            }
            "tcp" | "udp" | "icmp" | "any" => {
                once(r.proto.is_some() || any_proto, "a protocol")?;
                r.proto = match w {
                    "tcp" => Some(Proto::Tcp),
                    "udp" => Some(Proto::Udp),
                    "icmp" => Some(Proto::Icmp),
                    _ => None,
                };
                any_proto = w == "any";
            }
            "from" | "to" => {
                let c = Cidr::parse(arg()?)?;
                let slot = if w == "from" { &mut r.from } else { &mut r.to };
                once(slot.is_some(), w)?;
                *slot = Some(c);
                i += 1;
            }
            "port" | "sport" => {
                let p = ports(arg()?)?;
                let slot = if w == "port" { &mut r.dports } else { &mut r.sports };
                once(!slot.is_empty(), w)?;
                *slot = p;
                i += 1;
            }
            "rate" => {
                once(r.rate.is_some(), "rate")?;
                r.rate = Some(rate(arg()?)?);
                i += 1;
            }
            _ => return Err(format!("'{w}' is not part of the language (in, out, tcp, udp, icmp, any, from, to, port, sport, rate)")),
        }
        i += 1;
    }
    if (!r.dports.is_empty() || !r.sports.is_empty()) && !matches!(r.proto, Some(Proto::Tcp | Proto::Udp)) {
        return Err("ports need the protocol tcp or udp".into());
    }
    if r.rate.is_some() && r.action == Action::Deny {
        return Err("a rate limits what a rule allows: not on deny".into());
    }
    Ok(r)
}

impl Rules {
    /// Parse a rule set.
    pub fn parse(text: &str) -> Result<Rules, ParseError> {
        let mut rules = Vec::new();
        let mut default = None;
        for (n, raw) in text.lines().enumerate() {
            let line = n + 1;
            let err = |message: String| ParseError { line, message };
            if raw.len() > MAX_LINE {
                return Err(err(format!("longer than {MAX_LINE} bytes")));
            }
            let body = raw.split('#').next().unwrap_or("");
            let words: Vec<&str> = body.split_ascii_whitespace().collect();
            if words.is_empty() {
                continue;
            }
            if words[0] == "default" {
                let a = match words.get(1..) {
                    Some(["allow"]) => Action::Allow,
                    Some(["deny"]) => Action::Deny,
                    _ => return Err(err("`default allow` or `default deny`".into())),
                };
                if default.replace(a).is_some() {
                    return Err(err("a second default".into()));
                }
                continue;
            }
            if rules.len() == MAX_RULES {
                return Err(err(format!("more than {MAX_RULES} rules")));
            }
            rules.push(rule(&words, line).map_err(err)?);
        }
        Ok(Rules { rules, default: default.unwrap_or(Action::Deny) })
    }
}
