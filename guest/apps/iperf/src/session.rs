//! One test: its control connection's session (cookie, parameters,
//! phase), its streams and their counters, and its results.

use alloc::format;
use alloc::rc::Rc;
use alloc::string::String;
use alloc::vec::Vec;
use core::cell::{Cell, OnceCell, RefCell};

use wisp::net::Ipv4Addr;
use wisp::time::Instant;

use iperf_params::{Mode, Params, Proto};
use jsonlite as json;
use crate::protocol::COOKIE_SIZE;
use crate::sync::Signal;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Params,
    Creating,
    Running,
    Ending,
}

/// One test: its control connection's session and its streams.
pub struct Test {
    pub cookie: [u8; COOKIE_SIZE],
    pub params: OnceCell<Params>,
    pub phase: Cell<Phase>,
    pub streams: RefCell<Vec<Rc<Stream>>>,
    /// A stream was added.
    changed: Signal,
    /// Data may flow (TEST_RUNNING sent).
    pub running: Signal,
    /// The test is over: streams stop and close.
    pub stop: Signal,
    pub start_ns: Cell<u64>,
    pub end_ns: Cell<u64>,
    /// Bytes the server has sent on all streams.
    pub sent: Cell<u64>,
}

/// One data stream's counters.
#[derive(Default)]
pub struct Stream {
    /// Creation order.
    seq: u64,
    /// The client's address of a UDP stream.
    pub peer: Option<(Ipv4Addr, u16)>,
    id: Cell<u32>,
    /// The server sends on it (else it receives).
    pub sender: Cell<bool>,
    pub bytes: Cell<u64>,
    /// Bytes of the omitted start of the test (-O).
    omitted: Cell<u64>,
    /// UDP: datagrams sent, or the highest counter received.
    pub packets: Cell<u64>,
    /// UDP: datagrams lost.
    errors: Cell<u64>,
    outoforder: Cell<u64>,
    /// UDP: jitter in 1/256 ns.
    jitter: Cell<u64>,
    prev_transit: Cell<Option<i64>>,
}

impl Test {
    pub fn new(cookie: [u8; COOKIE_SIZE]) -> Test {
        Test {
            cookie,
            params: OnceCell::new(),
            phase: Cell::new(Phase::Params),
            streams: RefCell::new(Vec::new()),
            changed: Signal::default(),
            running: Signal::default(),
            stop: Signal::default(),
            start_ns: Cell::new(0),
            end_ns: Cell::new(0),
            sent: Cell::new(0),
        }
    }

    /// The parameters (set before any stream exists).
    pub fn p(&self) -> &Params {
        self.params.get().expect("parameters exchanged")
    }

    /// A new `proto` stream, if the test is creating streams and wants more.
    pub fn add_stream(&self, proto: Proto, seq: u64, peer: Option<(Ipv4Addr, u16)>) -> Option<Rc<Stream>> {
        if self.phase.get() != Phase::Creating || self.p().proto != proto {
            return None;
        }
        let mut streams = self.streams.borrow_mut();
        if streams.len() >= self.p().streams() {
            return None;
        }
        let s = Rc::new(Stream { seq, peer, ..Stream::default() });
        streams.push(s.clone());
        drop(streams);
        self.changed.notify();
        Some(s)
    }

    /// Wait until every stream is there.
    pub async fn all_streams(&self) {
        core::future::poll_fn(|cx| {
            if self.streams.borrow().len() >= self.p().streams() {
                core::task::Poll::Ready(())
            } else {
                self.changed.register(cx.waker());
                core::task::Poll::Pending
            }
        })
        .await
    }

    /// Number the streams and give them their direction in the order the
    /// client created them, as iperf3 does (ids 1, 3, 4, 5...).
    pub fn assign(&self) {
        let p = *self.p();
        let mut streams = self.streams.borrow_mut();
        streams.sort_by_key(|s| s.seq);
        for (i, s) in streams.iter().enumerate() {
            s.id.set(if i == 0 { 1 } else { i as u32 + 2 });
            s.sender.set(match p.mode {
                Mode::Receive => false,
                Mode::Send => true,
                Mode::Both => i >= p.parallel,
            });
        }
    }

    /// The omitted start of the test is over: count from now on.
    pub fn end_omit(&self) {
        for s in self.streams.borrow().iter() {
            s.omitted.set(s.bytes.get());
        }
        self.start_ns.set(now());
    }

    fn duration_ns(&self) -> u64 {
        self.end_ns.get().saturating_sub(self.start_ns.get())
    }

    /// The server's results (EXCHANGE_RESULTS), as iperf3's `send_results`.
    pub fn results(&self) -> String {
        let p = self.p();
        // No per-connection retransmit counts here: -1 marks "none" for a
        // receiving server, 0 "not available" for a sending one.
        let sender_has_retransmits = if p.mode == Mode::Receive { -1 } else { 0 };
        let end = json::seconds(self.duration_ns());
        let mut s = format!(
            "{{\"cpu_util_total\":0,\"cpu_util_user\":0,\"cpu_util_system\":0,\"sender_has_retransmits\":{},\"streams\":[",
            sender_has_retransmits
        );
        for (i, st) in self.streams.borrow().iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s += &format!(
                "{{\"id\":{},\"bytes\":{},\"retransmits\":-1,\"jitter\":{},\"errors\":{},\"packets\":{},\"start_time\":0,\"end_time\":{}}}",
                st.id.get(),
                st.counted(),
                json::seconds(st.jitter.get() / 256),
                st.errors.get(),
                st.packets.get(),
                end
            );
        }
        s.push(']');
        if p.server_output {
            s += ",\"server_output_text\":";
            s += &json::quote(&self.summary());
        }
        s.push('}');
        s
    }

    /// A human-readable account of the test.
    pub fn summary(&self) -> String {
        let ns = self.duration_ns().max(1);
        let mut out = String::new();
        for (dir, sender) in [("received", false), ("sent", true)] {
            let streams = self.streams.borrow();
            let ours: Vec<&Rc<Stream>> = streams.iter().filter(|s| s.sender.get() == sender).collect();
            if ours.is_empty() {
                continue;
            }
            let bytes: u64 = ours.iter().map(|s| s.counted()).sum();
            out += &format!(
                "iperf: {} {} bytes on {} stream(s) in {} s: {} Mbit/s",
                dir,
                bytes,
                ours.len(),
                json::seconds(ns),
                mbits(bytes, ns)
            );
            if self.p().proto == Proto::Udp && !sender {
                let packets: u64 = ours.iter().map(|s| s.packets.get()).sum();
                let lost: u64 = ours.iter().map(|s| s.errors.get()).sum();
                let jitter = ours.iter().map(|s| s.jitter.get() / 256).max().unwrap_or(0);
                out += &format!(", {}/{} datagrams lost, jitter {} ms", lost, packets, json::seconds(jitter * 1000));
            }
            out.push('\n');
        }
        out
    }
}

impl Stream {
    /// Bytes after the omitted start.
    fn counted(&self) -> u64 {
        self.bytes.get() - self.omitted.get()
    }

    /// Account a UDP datagram that arrived at `arrival` (wall clock, ns):
    /// losses from gaps in the counter, jitter from the changes of transit
    /// time (as iperf3's `iperf_udp_recv`).
    pub fn received(&self, d: &[u8], counters64: bool, arrival: u64) {
        self.bytes.set(self.bytes.get() + d.len() as u64);
        let be32 = |i: usize| u32::from_be_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]]) as u64;
        let (sec, usec) = (be32(0), be32(4));
        let pcount = if counters64 { be32(8) << 32 | be32(12) } else { be32(8) };
        let last = self.packets.get();
        if pcount > last {
            self.errors.set(self.errors.get() + (pcount - 1 - last));
            self.packets.set(pcount);
        } else {
            self.outoforder.set(self.outoforder.get() + 1);
            self.errors.set(self.errors.get().saturating_sub(1));
        }
        let sent = sec.wrapping_mul(1_000_000_000).wrapping_add(usec.wrapping_mul(1000));
        let transit = arrival.wrapping_sub(sent) as i64;
        if let Some(prev) = self.prev_transit.get() {
            let d = transit.wrapping_sub(prev).unsigned_abs().min(u64::MAX >> 9) * 256;
            let j = self.jitter.get();
            // j += (d - j) / 16
            self.jitter.set(if d >= j { j + (d - j) / 16 } else { j - (j - d) / 16 });
        }
        self.prev_transit.set(Some(transit));
    }
}

/// Bits per second of `bytes` in `ns`, in Mbit/s with two decimals.
fn mbits(bytes: u64, ns: u64) -> String {
    let centi = bytes as u128 * 8 * 100_000 / ns.max(1) as u128;
    format!("{}.{:02}", centi / 100, centi % 100)
}

/// Nanoseconds since boot.
pub fn now() -> u64 {
    Instant::now().as_nanos()
}
