//! CDNSim: a flow-level simulator of elastic CDNs (MiniCache's Section 3:
//! `../shared/papers/minicache-elastic-cdns.txt`). A CDN's caches run in
//! the access ASes of a country's AS graph, are started on demand and serve
//! after a boot time; viewers of live channels stream from a cache once it
//! is up, from the origin until then. This crate holds the pieces:
//!
//! - [`topology`]: AS graphs in CAIDA's AS-relationship format (`a|b|-1`
//!   provider → customer, `a|b|0` peers), AS roles and countries, link
//!   speeds by role, checked with the line of every error;
//! - [`gen`]: synthetic country-scale AS graphs (the model of networkx's
//!   `random_internet_as_graph`), written in the same format;
//! - [`routing`]: valley-free (Gao–Rexford) shortest paths;
//! - [`maxmin`]: max-min fair rates, recomputed for the flows a change
//!   touches;
//! - [`player`]: a viewer's playback buffer and its QoE;
//! - [`workload`]: the viewers: arrivals, channels, bitrates, sessions;
//! - [`sim`]: the run: caches booting on demand, flows, QoE;
//! - [`report`], [`plot`]: its summary (JSON) and plots (PNG).

pub mod gen;
pub mod maxmin;
pub mod player;
pub mod plot;
pub mod report;
pub mod routing;
pub mod sim;
pub mod topology;
pub mod workload;
