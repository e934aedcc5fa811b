//! AS graphs: CAIDA's AS-relationship format, with AS roles and countries.
//!
//! A file is lines of `a|b|-1` (AS `a` is a provider of AS `b`) and
//! `a|b|0` (peers); a fourth field (CAIDA's `source`) is ignored; `#` starts
//! a comment. Two comment forms carry what CAIDA's relationships do not
//! (CAIDA's tools skip them as comments):
//!
//! ```text
//! # role 3320 transit        content | transit | access
//! # country 3320 DE
//! ```
//!
//! An AS without a role line is a transit AS if it has customers and an
//! access AS if it has none. Links get their capacity from the roles at
//! their ends (MiniCache's setup): 40 Gb/s between transit and content
//! ASes, 10 Gb/s on a link of an access AS; and a one-way delay.

use std::collections::HashMap;
use std::fmt;

/// What an AS does in the CDN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Holds the content (the origin).
    Content,
    /// Carries traffic between others.
    Transit,
    /// Has the viewers, and may run caches.
    Access,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Content => "content",
            Role::Transit => "transit",
            Role::Access => "access",
        }
    }

    fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "content" => Role::Content,
            "transit" => Role::Transit,
            "access" => Role::Access,
            _ => return None,
        })
    }
}

/// An AS of the graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct As {
    pub asn: u32,
    pub role: Role,
    pub country: Option<String>,
}

/// The business relationship a link stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `a` is a provider of `b`.
    Transit,
    /// `a` and `b` are peers.
    Peer,
}

/// A link between two ASes (indices into [`Topology::ases`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    pub a: usize,
    pub b: usize,
    pub kind: Kind,
    pub capacity_bps: f64,
    pub delay_s: f64,
}

/// Which way a link goes from one of its ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// To a provider.
    Up,
    /// To a peer.
    Across,
    /// To a customer.
    Down,
}

/// Link speeds and delays by role.
#[derive(Clone, Copy, Debug)]
pub struct Speeds {
    /// Between transit and content ASes.
    pub core_bps: f64,
    /// On a link of an access AS.
    pub access_bps: f64,
    /// One-way delay of any inter-AS link.
    pub delay_s: f64,
}

impl Default for Speeds {
    fn default() -> Self {
        Speeds { core_bps: 40e9, access_bps: 10e9, delay_s: 0.002 }
    }
}

/// An AS graph.
#[derive(Clone, Debug, Default)]
pub struct Topology {
    pub ases: Vec<As>,
    pub links: Vec<Link>,
    /// Per AS: (neighbour, link, direction from this AS).
    pub adj: Vec<Vec<(usize, usize, Dir)>>,
    index: HashMap<u32, usize>,
}

/// A malformed topology file: the line and what is wrong with it.
#[derive(Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub msg: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.msg)
    }
}

impl std::error::Error for ParseError {}

fn asn(s: &str, line: usize) -> Result<u32, ParseError> {
    match s.trim().parse::<u32>() {
        Ok(0) | Err(_) => Err(ParseError { line, msg: format!("'{}' is not an AS number (1 to 4294967295)", s.trim()) }),
        Ok(n) => Ok(n),
    }
}

impl Topology {
    /// Read a topology in CAIDA's format (see the module comment).
    pub fn parse(text: &str, speeds: Speeds) -> Result<Topology, ParseError> {
        let mut t = Topology::default();
        let mut roles: HashMap<u32, (Role, usize)> = HashMap::new();
        let mut countries: HashMap<u32, String> = HashMap::new();
        let mut seen: HashMap<(u32, u32), usize> = HashMap::new();
        let mut pending: Vec<(u32, u32, Kind)> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let s = raw.trim();
            if s.is_empty() {
                continue;
            }
            if let Some(c) = s.strip_prefix('#') {
                let w: Vec<&str> = c.split_whitespace().collect();
                match w.as_slice() {
                    ["role", a, r] => {
                        let role = Role::parse(r).ok_or_else(|| ParseError { line, msg: format!("role '{r}': content, transit or access") })?;
                        roles.insert(asn(a, line)?, (role, line));
                    }
                    ["role", ..] => return Err(ParseError { line, msg: "a role line is '# role ASN content|transit|access'".into() }),
                    ["country", a, cc] => {
                        countries.insert(asn(a, line)?, cc.to_string());
                    }
                    ["country", ..] => return Err(ParseError { line, msg: "a country line is '# country ASN CODE'".into() }),
                    _ => {}
                }
                continue;
            }
            let f: Vec<&str> = s.split('|').collect();
            if f.len() < 3 || f.len() > 4 {
                return Err(ParseError { line, msg: format!("'{s}': expected a|b|-1 or a|b|0") });
            }
            let (a, b) = (asn(f[0], line)?, asn(f[1], line)?);
            let kind = match f[2].trim() {
                "-1" => Kind::Transit,
                "0" => Kind::Peer,
                r => return Err(ParseError { line, msg: format!("relationship '{r}': -1 (provider|customer) or 0 (peers)") }),
            };
            if a == b {
                return Err(ParseError { line, msg: format!("AS {a} linked to itself") });
            }
            let key = (a.min(b), a.max(b));
            if let Some(first) = seen.insert(key, line) {
                return Err(ParseError { line, msg: format!("AS {a} and AS {b} are linked already (line {first})") });
            }
            pending.push((a, b, kind));
        }
        for (a, b, kind) in pending {
            let (ia, ib) = (t.intern(a), t.intern(b));
            t.links.push(Link { a: ia, b: ib, kind, capacity_bps: 0.0, delay_s: speeds.delay_s });
        }
        for (&a, &(_, line)) in &roles {
            if !t.index.contains_key(&a) {
                return Err(ParseError { line, msg: format!("AS {a} has a role but no link") });
            }
        }
        t.finish(|a, has_customers| match roles.get(&a) {
            Some(&(r, _)) => r,
            None if has_customers => Role::Transit,
            None => Role::Access,
        });
        for a in t.ases.iter_mut() {
            a.country = countries.get(&a.asn).cloned();
        }
        t.set_speeds(speeds);
        Ok(t)
    }

    /// The index of AS `asn`, added if new (role fixed in `finish`).
    fn intern(&mut self, asn: u32) -> usize {
        let n = self.ases.len();
        *self.index.entry(asn).or_insert_with(|| {
            self.ases.push(As { asn, role: Role::Access, country: None });
            n
        })
    }

    /// Build the adjacency and give each AS its role.
    fn finish(&mut self, role: impl Fn(u32, bool) -> Role) {
        self.adj = vec![Vec::new(); self.ases.len()];
        let mut has_customers = vec![false; self.ases.len()];
        for (l, link) in self.links.iter().enumerate() {
            let (da, db) = match link.kind {
                Kind::Transit => {
                    has_customers[link.a] = true;
                    (Dir::Down, Dir::Up)
                }
                Kind::Peer => (Dir::Across, Dir::Across),
            };
            self.adj[link.a].push((link.b, l, da));
            self.adj[link.b].push((link.a, l, db));
        }
        for (i, a) in self.ases.iter_mut().enumerate() {
            a.role = role(a.asn, has_customers[i]);
        }
    }

    /// Give every link its capacity from the roles at its ends.
    pub fn set_speeds(&mut self, s: Speeds) {
        for l in self.links.iter_mut() {
            let access = self.ases[l.a].role == Role::Access || self.ases[l.b].role == Role::Access;
            l.capacity_bps = if access { s.access_bps } else { s.core_bps };
            l.delay_s = s.delay_s;
        }
    }

    /// The index of AS `asn`.
    pub fn find(&self, asn: u32) -> Option<usize> {
        self.index.get(&asn).copied()
    }

    /// The ASes of a role, by index.
    pub fn with_role(&self, role: Role) -> impl Iterator<Item = usize> + '_ {
        self.ases.iter().enumerate().filter(move |(_, a)| a.role == role).map(|(i, _)| i)
    }

    /// The ASes of `country` and the links among them (a CDN serves one
    /// country: MiniCache's simulations take a country's ASes).
    pub fn country(&self, cc: &str) -> Topology {
        let keep: Vec<bool> = self.ases.iter().map(|a| a.country.as_deref() == Some(cc)).collect();
        let mut t = Topology::default();
        let mut map = vec![usize::MAX; self.ases.len()];
        for (i, a) in self.ases.iter().enumerate().filter(|(i, _)| keep[*i]) {
            map[i] = t.ases.len();
            t.index.insert(a.asn, t.ases.len());
            t.ases.push(a.clone());
        }
        for l in self.links.iter().filter(|l| keep[l.a] && keep[l.b]) {
            t.links.push(Link { a: map[l.a], b: map[l.b], ..l.clone() });
        }
        let roles: HashMap<u32, Role> = t.ases.iter().map(|a| (a.asn, a.role)).collect();
        t.finish(|a, _| roles[&a]);
        t
    }

    /// The topology in the file format [`Topology::parse`] reads.
    pub fn write(&self) -> String {
        let mut out = String::from("# AS relationships (CAIDA's format: provider|customer|-1, peer|peer|0)\n");
        for a in &self.ases {
            out += &format!("# role {} {}\n", a.asn, a.role.name());
            if let Some(cc) = &a.country {
                out += &format!("# country {} {}\n", a.asn, cc);
            }
        }
        for l in &self.links {
            let r = if l.kind == Kind::Transit { -1 } else { 0 };
            out += &format!("{}|{}|{}\n", self.ases[l.a].asn, self.ases[l.b].asn, r);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = "\
# a comment
# role 10 content
# country 10 DE
# country 1 DE
# country 2 DE
1|2|0
1|10|-1
1|3|-1
2|4|-1|bgp
";

    #[test]
    fn a_small_file_is_read_with_roles_countries_and_speeds() {
        let t = Topology::parse(SMALL, Speeds::default()).unwrap();
        assert_eq!(t.ases.len(), 5);
        let role = |asn| t.ases[t.find(asn).unwrap()].role;
        assert_eq!([role(1), role(2), role(10), role(3), role(4)], [Role::Transit, Role::Transit, Role::Content, Role::Access, Role::Access]);
        let link = |a, b| t.links.iter().find(|l| t.ases[l.a].asn == a && t.ases[l.b].asn == b).unwrap();
        assert_eq!((link(1, 2).kind, link(1, 2).capacity_bps), (Kind::Peer, 40e9));
        assert_eq!((link(1, 10).kind, link(1, 10).capacity_bps), (Kind::Transit, 40e9));
        assert_eq!(link(1, 3).capacity_bps, 10e9);
        let de = t.country("DE");
        assert_eq!(de.ases.iter().map(|a| a.asn).collect::<Vec<_>>(), [1, 2, 10]);
        assert_eq!(de.links.len(), 2);
        // Written and read again: the same graph.
        let again = Topology::parse(&t.write(), Speeds::default()).unwrap();
        assert_eq!(again.ases, t.ases);
        assert_eq!(again.links, t.links);
    }

    #[test]
    fn malformed_files_are_refused_with_their_line() {
        for (text, line, what) in [
            ("1|2|0\n1|2\n", 2, "expected a|b|-1"),
            ("1|2|1\n", 1, "relationship '1'"),
            ("1|x|0\n", 1, "'x' is not an AS number"),
            ("0|2|0\n", 1, "'0' is not an AS number"),
            ("1|1|0\n", 1, "linked to itself"),
            ("1|2|0\n\n2|1|-1\n", 3, "linked already (line 1)"),
            ("# role 1 origin\n1|2|0\n", 1, "role 'origin'"),
            ("# role 1\n", 1, "a role line is"),
            ("1|2|0\n# role 7 access\n", 2, "AS 7 has a role but no link"),
            ("1|2|0|x|y\n", 1, "expected a|b|-1"),
        ] {
            let e = Topology::parse(text, Speeds::default()).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.msg.contains(what), "{text:?}: {e}");
            assert!(e.to_string().starts_with(&format!("line {line}: ")));
        }
    }
}
