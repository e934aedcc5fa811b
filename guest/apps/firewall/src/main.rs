//! `firewall [RULES]`: a personal firewall (LightVM §7.1), on the path of
//! one client's traffic. The VM's first NIC is the uplink (towards its
//! gateway), the second the client's link; the VM routes the client's
//! subnet between them and forwards what the rules in file RULES (default
//! `/rules`, given with `--file FILE:/rules`) allow — the language is
//! `fwcore::rules`'s, documented in `docs/usecases.md`. It says
//! `firewall: up ...` once it forwards, and on a stop prints its counters
//! (`firewall: counters ...`) before it exits 0. Bad rules: the line and
//! why, and exit status 2.
#![no_std]
#![no_main]

extern crate alloc;

use fwcore::filter::Filter;
use core::sync::atomic::{AtomicU64, Ordering};

use fwcore::router::{Firewall, Port, Side, Stats, Verdict};
use fwcore::rules::Rules;
use wisp::net::link::{self, Link};
use wisp::time::monotonic_ns;

wisp::main!(
    main,
    wisp::Manifest::new().device(wisp::abi::DeviceKind::Net, "uplink", true).device(wisp::abi::DeviceKind::Net, "client", true)
);

/// Frames taken from a link before the other is looked at.
const BATCH: usize = 64;
/// How long an idle loop keeps looking at the rings before it parks, at
/// most (adaptive, as Linux's halt polling: a frame within the window
/// doubles it, a window spent for nothing halves it). Frames that come
/// closer together than a park and wake-up cost are caught spinning; a
/// client's frames a millisecond apart cost no spinning at all.
const SPIN_MAX_NS: u64 = 50_000;
const SPIN_MIN_NS: u64 = 500;
/// Longest park (the gateway's address is asked for again after it, if
/// still unknown).
const PARK_NS: u64 = 1_000_000_000;

/// The counters as of the last pass, for the stop handler (a plain `fn`).
static COUNTERS: [AtomicU64; 10] = [const { AtomicU64::new(0) }; 10];

fn keep(s: &Stats) {
    let v = [s.forwarded_out, s.forwarded_in, s.denied, s.over_rate, s.spoofed, s.malformed, s.expired, s.local, s.unresolved, s.arp_answered];
    for (c, v) in COUNTERS.iter().zip(v) {
        c.store(v, Ordering::Relaxed);
    }
}

fn main() -> i32 {
    let path = wisp::env::arg(1).unwrap_or("/rules");
    let text = match wisp::fs::read_to_str(path) {
        Ok(t) => t,
        Err(e) => {
            wisp::println!("firewall: cannot read the rules at {}: {:?} (give them with --file FILE:{})", path, e, path);
            return 2;
        }
    };
    let rules = match Rules::parse(text) {
        Ok(r) => r,
        Err(e) => {
            wisp::println!("firewall: {}: {}", path, e);
            return 2;
        }
    };
    let mut links = match link::take() {
        Ok(l) if l.len() == 2 => l,
        Ok(l) => {
            wisp::println!("firewall: needs two NICs (uplink, client's link); has {}", l.len());
            return 2;
        }
        Err(e) => {
            wisp::println!("firewall: no NICs: {}", e);
            return 2;
        }
    };
    let side = |l: &Link| {
        let c = l.config();
        Side::new(c.mac, c.ip.octets(), c.prefix, c.gateway.map(|g| g.octets()))
    };
    let n = rules.rules.len();
    let mut fw = Firewall::new(side(&links[0]), side(&links[1]), Filter::new(rules, monotonic_ns()));
    wisp::process::on_stop(stop);
    let (up, cl) = (links[0].config(), links[1].config());
    wisp::println!("firewall: up, uplink {}/{}, client's link {}/{}, {} rules", up.ip, up.prefix, cl.ip, cl.prefix, n);
    let mut asked = 0u64;
    let mut idle_since = None;
    let mut window = SPIN_MIN_NS;
    loop {
        let now = monotonic_ns();
        // The gateway, until it is known (and again a park later).
        if let Some(gw) = fw.gateway_unknown() {
            if now.saturating_sub(asked) >= PARK_NS || asked == 0 {
                asked = now;
                let q = fw.arp_request(Port::Uplink, gw);
                send_copy(&mut links[0], &q);
            }
        }
        let moved = pass(&mut fw, &mut links, Port::Client, now) + pass(&mut fw, &mut links, Port::Uplink, now);
        for l in links.iter_mut() {
            l.flush_before_wait();
        }
        keep(&fw.stats);
        if moved > 0 {
            if idle_since.take().is_some() {
                window = (window * 2).min(SPIN_MAX_NS);
            }
            continue;
        }
        let since = *idle_since.get_or_insert(now);
        if now - since < window {
            core::hint::spin_loop();
            continue;
        }
        idle_since = None;
        window = (window / 2).max(SPIN_MIN_NS);
        if let Some(i) = links.iter_mut().position(|l| l.is_down()) {
            wisp::println!("firewall: NIC {} was stopped by the monitor", i);
            stop_with(3);
        }
        // Woken by frames; by the clock only while the gateway is unknown.
        let timeout = if fw.gateway_unknown().is_some() { PARK_NS } else { u64::MAX };
        link::wait(&mut links, timeout);
    }
}

/// Move up to a batch of frames that came in by `from`; how many.
fn pass(fw: &mut Firewall, links: &mut [Link], from: Port, now: u64) -> usize {
    let (a, b) = links.split_at_mut(1);
    let (src, dst) = match from {
        Port::Uplink => (&mut a[0], &mut b[0]),
        Port::Client => (&mut b[0], &mut a[0]),
    };
    let mut moved = 0;
    while moved < BATCH && dst.has_room() {
        let Some(back) = src.recv(|frame, h| match fw.inspect(from, frame, now) {
            Verdict::Forward { mac } => {
                if let Some(h) = dst.header_for(frame, h) {
                    let sent = dst.send(frame.len(), h, |buf| {
                        buf.copy_from_slice(frame);
                        fw.rewrite(from.other(), mac, buf);
                    });
                    if sent.is_none() {
                        fw.stats.unresolved += 1;
                    }
                } else {
                    fw.stats.malformed += 1;
                }
                None
            }
            Verdict::Answer(f) => Some((true, f)),
            Verdict::Resolve(f) => Some((false, f)),
            Verdict::Drop => None,
        }) else {
            break;
        };
        moved += 1;
        match back {
            Some((true, f)) => send_copy(src, &f),
            Some((false, f)) => send_copy(dst, &f),
            None => {}
        }
    }
    moved
}

fn send_copy(l: &mut Link, f: &[u8]) {
    let _ = l.send(f.len(), Default::default(), |buf| buf.copy_from_slice(f));
}

fn stop() {
    stop_with(0);
}

/// Print the counters and exit with `code`.
fn stop_with(code: i32) -> ! {
    let names = ["out", "in", "denied", "over_rate", "spoofed", "malformed", "expired", "local", "unresolved", "arp"];
    let mut line = alloc::string::String::from("firewall: counters");
    for (name, c) in names.iter().zip(&COUNTERS) {
        line.push_str(&alloc::format!(" {name} {}", c.load(Ordering::Relaxed)));
    }
    wisp::println!("{}", line);
    wisp::exit(code)
}
