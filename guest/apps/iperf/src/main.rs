//! `iperf [PORT]`: an iperf3 server (`iperf3 -s`) on port 5201 (or PORT)
//! that the real iperf3 client can measure: TCP and UDP, parallel streams
//! (`-P`), reverse (`-R`) and bidirectional (`--bidir`) tests, block sizes
//! (`-l`), durations (`-t`), byte and block counts (`-n`, `-k`), rates
//! (`-b`, also paced TCP) and 64-bit UDP counters. Window sizes (`-w`) are
//! accepted but the stack's buffers are fixed. Tests are served one after
//! another; a client that comes while a test runs is told the server is
//! busy (ACCESS_DENIED), as `iperf3 -s` does.
//!
//! The control protocol (iperf3's `iperf_api.c`): the client connects and
//! sends a 37-byte cookie; the server drives the test with one-byte states
//! (PARAM_EXCHANGE, CREATE_STREAMS, TEST_START, TEST_RUNNING,
//! EXCHANGE_RESULTS, DISPLAY_RESULTS), the client answers with JSON
//! messages (a 4-byte big-endian length, then the text) and ends the test
//! with TEST_END and the session with IPERF_DONE. TCP data streams are more
//! connections to the same port that start with the cookie; a UDP stream
//! starts with a 4-byte datagram the server answers, and UDP data carries
//! the sender's time and a packet counter, from which the receiver counts
//! losses and computes jitter (RFC 1889).
#![no_std]
#![no_main]

extern crate alloc;

mod json;
mod sync;

use alloc::format;
use alloc::rc::Rc;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::{Cell, OnceCell, RefCell};
use core::time::Duration;

use sync::{race, until, Either, Signal};
use wisp::net::{Ipv4Addr, TcpListener, TcpOptions, TcpStream, UdpSocket};
use wisp::time::Instant;

wisp::main!(main);

const DEFAULT_PORT: u16 = 5201;
/// The client's session cookie: 36 characters and a NUL.
const COOKIE_SIZE: usize = 37;

// Control states (iperf_api.h).
const TEST_START: u8 = 1;
const TEST_RUNNING: u8 = 2;
const TEST_END: u8 = 4;
const PARAM_EXCHANGE: u8 = 9;
const CREATE_STREAMS: u8 = 10;
const CLIENT_TERMINATE: u8 = 12;
const EXCHANGE_RESULTS: u8 = 13;
const DISPLAY_RESULTS: u8 = 14;
const IPERF_DONE: u8 = 16;
const ACCESS_DENIED: u8 = -1i8 as u8;
const SERVER_ERROR: u8 = -2i8 as u8;

// Error codes (i_errno) sent after SERVER_ERROR.
const IENUMSTREAMS: i32 = 6;
const IEBLOCKSIZE: i32 = 7;
const IENOSCTP: i32 = 18;

/// The UDP "connect" datagram and the answer, as x86 iperf3 sends them
/// (an int in host order): "9876" and "6789"; before 3.11: 123456789 and
/// 987654321.
const UDP_CONNECT_REPLY: u32 = 0x3938_3736;
const LEGACY_UDP_CONNECT_MSG: u32 = 123_456_789;
const LEGACY_UDP_CONNECT_REPLY: u32 = 987_654_321;

/// Largest UDP payload that fits one frame (the stack does not reassemble
/// IP fragments).
const MAX_DATAGRAM: usize = wisp::abi::net::MTU as usize - 20 - 8;
/// TCP socket buffers (the largest window we advertise).
const SOCKET_BUFFER: usize = 128 << 10;
/// Listening sockets kept ready (each holds its buffers).
const BACKLOG: usize = 4;
/// Largest block a TCP sending stream writes at once.
const SEND_BLOCK: usize = 128 << 10;
/// A TCP receiving stream's read buffer.
const RECV_BUFFER: usize = 32 << 10;
/// Heap a test leaves free (control connection, refilled listening
/// sockets, messages).
const HEAP_RESERVE: usize = 2 << 20;
/// Longest JSON message accepted from a client.
const MAX_JSON: usize = 256 << 10;
/// How long a new connection may take to send its cookie, and the client
/// to send its parameters and results.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// A test is abandoned this long after its announced end if the client
/// does not end it.
const TEST_END_SLACK: Duration = Duration::from_secs(30);

fn main() -> i32 {
    let (port, cfg) = match wisp::net::server_args("iperf", 1, DEFAULT_PORT) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let opts =
        TcpOptions { backlog: BACKLOG, rx_buffer: SOCKET_BUFFER, tx_buffer: SOCKET_BUFFER, ..TcpOptions::default() };
    let listener = match TcpListener::bind_app("iperf", port, opts) {
        Ok(l) => l,
        Err(code) => return code,
    };
    wisp::println!("iperf: listening on {}:{}", cfg.ip, port);
    let server = Rc::new(Server { port, current: RefCell::new(None), next_seq: Cell::new(0) });
    listener.serve_app("iperf", move |conn| {
        let seq = server.next_seq.get();
        server.next_seq.set(seq + 1);
        handle(server.clone(), conn, seq)
    })
}

struct Server {
    port: u16,
    /// The test under way (one at a time).
    current: RefCell<Option<Rc<Test>>>,
    /// Accept order of TCP connections (orders a test's streams).
    next_seq: Cell<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Proto {
    Tcp,
    Udp,
}

/// Which way data flows, from the server's point of view.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// The client sends (the default).
    Receive,
    /// The server sends (`-R`).
    Send,
    /// Both (`--bidir`): the first half of the streams carry data from the
    /// client, the second half to it.
    Both,
}

/// A test's parameters, from the client's PARAM_EXCHANGE message.
#[derive(Clone, Copy, Debug)]
struct Params {
    proto: Proto,
    mode: Mode,
    /// Streams per direction (`-P`).
    parallel: usize,
    /// Seconds (`-t`; 0 when the test ends by bytes or blocks).
    time: u64,
    omit: u64,
    /// Bytes to send in all (`-n`), 0 for no limit.
    num: u64,
    /// Blocks to send in all (`-k`), 0 for no limit.
    blocks: u64,
    /// Block (TCP) or datagram (UDP) size (`-l`).
    len: usize,
    /// Bits per second per sending stream (`-b`), 0 for unlimited.
    rate: u64,
    /// Pacing interval of a rate-limited sender.
    pacing_us: u64,
    /// Requested socket buffer size (`-w`); informational.
    window: u64,
    nodelay: bool,
    counters64: bool,
    server_output: bool,
}

impl Params {
    /// The parameters of `j`, or the iperf3 error code to refuse them with.
    fn from_json(j: &json::Object) -> Result<Params, i32> {
        let proto = if j.flag("udp") {
            Proto::Udp
        } else if j.flag("sctp") {
            return Err(IENOSCTP);
        } else {
            Proto::Tcp
        };
        let mode = match (j.has("reverse"), j.has("bidirectional")) {
            (_, true) => Mode::Both,
            (true, false) => Mode::Send,
            _ => Mode::Receive,
        };
        let int = |k: &str, default: i64| j.int(k).unwrap_or(default).max(0) as u64;
        let default_len = match proto {
            Proto::Tcp => 128 << 10,
            Proto::Udp => 1460,
        };
        let p = Params {
            proto,
            mode,
            parallel: int("parallel", 1).clamp(1, 128) as usize,
            time: int("time", 10),
            omit: int("omit", 0),
            num: int("num", 0),
            blocks: int("blockcount", 0),
            len: match int("len", 0) {
                0 => default_len,
                n => n.min(1 << 30) as usize,
            },
            rate: int("bandwidth", 0),
            pacing_us: int("pacing_timer", 1000).clamp(100, 1_000_000),
            window: int("window", 0),
            nodelay: j.has("nodelay"),
            counters64: j.has("udp_counters_64bit"),
            server_output: j.has("get_server_output"),
        };
        if p.proto == Proto::Udp && (p.len > MAX_DATAGRAM || p.len < p.udp_header()) {
            // The stack neither fragments nor reassembles datagrams.
            return Err(IEBLOCKSIZE);
        }
        Ok(p)
    }

    /// Streams in all.
    fn streams(&self) -> usize {
        match self.mode {
            Mode::Both => 2 * self.parallel,
            _ => self.parallel,
        }
    }

    /// Bytes the server sends in all before it stops, if limited.
    fn send_limit(&self) -> Option<u64> {
        match (self.num, self.blocks) {
            (0, 0) => None,
            (0, k) => Some(k.saturating_mul(self.len as u64)),
            (n, _) => Some(n),
        }
    }

    /// Size of the UDP header: seconds, microseconds, packet counter.
    fn udp_header(&self) -> usize {
        if self.counters64 {
            16
        } else {
            12
        }
    }

    fn describe(&self) -> String {
        let dir = match self.mode {
            Mode::Receive => "receiving",
            Mode::Send => "sending (reverse)",
            Mode::Both => "both ways",
        };
        let mut s = format!("{:?}, {} stream(s), {}, {} byte blocks", self.proto, self.parallel, dir, self.len);
        if self.time > 0 {
            s += &format!(", {} s", self.time);
        }
        if self.rate > 0 {
            s += &format!(", {} bit/s", self.rate);
        }
        if self.window > 0 {
            s += &format!(", window {} requested (buffers are {} KiB)", self.window, SOCKET_BUFFER >> 10);
        }
        s
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Params,
    Creating,
    Running,
    Ending,
}

/// One test: its control connection's session and its streams.
struct Test {
    cookie: [u8; COOKIE_SIZE],
    params: OnceCell<Params>,
    phase: Cell<Phase>,
    streams: RefCell<Vec<Rc<Stream>>>,
    /// A stream was added.
    changed: Signal,
    /// Data may flow (TEST_RUNNING sent).
    running: Signal,
    /// The test is over: streams stop and close.
    stop: Signal,
    start_ns: Cell<u64>,
    end_ns: Cell<u64>,
    /// Bytes the server has sent on all streams.
    sent: Cell<u64>,
}

/// One data stream's counters.
#[derive(Default)]
struct Stream {
    /// Creation order.
    seq: u64,
    /// The client's address of a UDP stream.
    peer: Option<(Ipv4Addr, u16)>,
    id: Cell<u32>,
    /// The server sends on it (else it receives).
    sender: Cell<bool>,
    bytes: Cell<u64>,
    /// Bytes of the omitted start of the test (-O).
    omitted: Cell<u64>,
    /// UDP: datagrams sent, or the highest counter received.
    packets: Cell<u64>,
    /// UDP: datagrams lost.
    errors: Cell<u64>,
    outoforder: Cell<u64>,
    /// UDP: jitter in 1/256 ns.
    jitter: Cell<u64>,
    prev_transit: Cell<Option<i64>>,
}

impl Test {
    fn new(cookie: [u8; COOKIE_SIZE]) -> Test {
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
    fn p(&self) -> &Params {
        self.params.get().expect("parameters exchanged")
    }

    /// A new `proto` stream, if the test is creating streams and wants more.
    fn add_stream(&self, proto: Proto, seq: u64, peer: Option<(Ipv4Addr, u16)>) -> Option<Rc<Stream>> {
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
    async fn all_streams(&self) {
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
    fn assign(&self) {
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
    fn end_omit(&self) {
        for s in self.streams.borrow().iter() {
            s.omitted.set(s.bytes.get());
        }
        self.start_ns.set(now());
    }

    fn duration_ns(&self) -> u64 {
        self.end_ns.get().saturating_sub(self.start_ns.get())
    }

    /// The server's results (EXCHANGE_RESULTS), as iperf3's `send_results`.
    fn results(&self) -> String {
        let p = self.p();
        // No per-connection retransmit counts here: -1 marks "none" for a
        // receiving server, 0 "not available" for a sending one.
        let sender_has_retransmits = if p.mode == Mode::Receive { -1 } else { 0 };
        let end = json::secs(self.duration_ns());
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
                json::secs(st.jitter.get() / 256),
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
    fn summary(&self) -> String {
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
                json::secs(ns),
                mbits(bytes, ns)
            );
            if self.p().proto == Proto::Udp && !sender {
                let packets: u64 = ours.iter().map(|s| s.packets.get()).sum();
                let lost: u64 = ours.iter().map(|s| s.errors.get()).sum();
                let jitter = ours.iter().map(|s| s.jitter.get() / 256).max().unwrap_or(0);
                out += &format!(", {}/{} datagrams lost, jitter {} ms", lost, packets, json::secs(jitter * 1000));
            }
            out.push('\n');
        }
        out
    }
}

/// Bits per second of `bytes` in `ns`, in Mbit/s with two decimals.
fn mbits(bytes: u64, ns: u64) -> String {
    let centi = bytes as u128 * 8 * 100_000 / ns.max(1) as u128;
    format!("{}.{:02}", centi / 100, centi % 100)
}

fn now() -> u64 {
    Instant::now().as_nanos()
}

/// Serve one new connection: a test's control connection, one of its
/// streams, or a client to turn away.
async fn handle(server: Rc<Server>, conn: TcpStream, seq: u64) {
    let mut cookie = [0u8; COOKIE_SIZE];
    match race(read_exact(&conn, &mut cookie), wisp::exec::sleep(MESSAGE_TIMEOUT)).await {
        Either::Left(Ok(())) => {}
        _ => return,
    }
    let current = server.current.borrow().clone();
    match current {
        None => {
            let test = Rc::new(Test::new(cookie));
            *server.current.borrow_mut() = Some(test.clone());
            if let Some((ip, port)) = conn.peer_addr() {
                wisp::println!("iperf: accepted connection from {}:{}", ip, port);
            }
            control(&server, &test, conn).await;
            test.stop.set();
            *server.current.borrow_mut() = None;
        }
        Some(test) if test.cookie == cookie => match test.add_stream(Proto::Tcp, seq, None) {
            Some(stream) => tcp_stream(test, conn, stream).await,
            None => deny(conn).await,
        },
        // Busy with another client's test.
        Some(_) => deny(conn).await,
    }
}

async fn deny(conn: TcpStream) {
    let _ = conn.write_all(&[ACCESS_DENIED]).await;
}

async fn read_exact(conn: &TcpStream, buf: &mut [u8]) -> Result<(), ()> {
    let mut off = 0;
    while off < buf.len() {
        match conn.read(&mut buf[off..]).await {
            Ok(0) | Err(_) => return Err(()),
            Ok(n) => off += n,
        }
    }
    Ok(())
}

/// The next state byte from the client; `None` at end of stream.
async fn read_state(conn: &TcpStream) -> Option<u8> {
    let mut b = [0u8];
    read_exact(conn, &mut b).await.ok().map(|_| b[0])
}

/// A JSON message: 4-byte big-endian length, then the text.
async fn read_json(conn: &TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    read_exact(conn, &mut len).await.ok()?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_JSON {
        return None;
    }
    let mut text = vec![0u8; len];
    read_exact(conn, &mut text).await.ok()?;
    Some(text)
}

async fn write_json(conn: &TcpStream, text: &str) -> bool {
    let mut msg = Vec::with_capacity(4 + text.len());
    msg.extend_from_slice(&(text.len() as u32).to_be_bytes());
    msg.extend_from_slice(text.as_bytes());
    conn.write_all(&msg).await.is_ok()
}

/// Refuse the test: SERVER_ERROR, iperf3's error code and an errno.
async fn server_error(conn: &TcpStream, code: i32) {
    let mut msg = [0u8; 9];
    msg[0] = SERVER_ERROR;
    msg[1..5].copy_from_slice(&code.to_be_bytes());
    let _ = conn.write_all(&msg).await;
}

/// Drive one test over its control connection.
async fn control(server: &Server, test: &Rc<Test>, conn: TcpStream) {
    conn.set_nodelay(true);
    if conn.write_all(&[PARAM_EXCHANGE]).await.is_err() {
        return;
    }
    let Either::Left(Some(text)) = race(read_json(&conn), wisp::exec::sleep(MESSAGE_TIMEOUT)).await else {
        wisp::println!("iperf: no parameters from the client");
        return;
    };
    let Some(obj) = json::parse(&text) else {
        wisp::println!("iperf: malformed parameters: {}", String::from_utf8_lossy(&text));
        return;
    };
    let p = match Params::from_json(&obj) {
        Ok(p) => p,
        Err(code) => {
            wisp::println!("iperf: refusing the test (iperf3 error {})", code);
            server_error(&conn, code).await;
            return;
        }
    };
    // Each TCP stream holds its socket's buffers and one block.
    let per_stream = match p.proto {
        Proto::Tcp => 2 * SOCKET_BUFFER + p.len.clamp(RECV_BUFFER, SEND_BLOCK),
        Proto::Udp => 256,
    };
    let (_, free) = wisp::heap::usage();
    let need = p.streams() * per_stream + HEAP_RESERVE;
    if need > free {
        wisp::println!(
            "iperf: refusing {} streams: {} KiB of memory needed, {} KiB free",
            p.streams(),
            need >> 10,
            free >> 10
        );
        server_error(&conn, IENUMSTREAMS).await;
        return;
    }
    wisp::println!("iperf: test: {}", p.describe());
    let _ = test.params.set(p);

    let udp = match p.proto {
        Proto::Tcp => None,
        Proto::Udp => {
            let sock = match bind_udp(server.port).await {
                Some(s) => Rc::new(s),
                None => return,
            };
            wisp::exec::spawn(udp_receive(test.clone(), sock.clone()));
            Some(sock)
        }
    };

    test.phase.set(Phase::Creating);
    if conn.write_all(&[CREATE_STREAMS]).await.is_err() {
        return;
    }
    // Anything from the client now (CLIENT_TERMINATE, end of stream) ends
    // the test; so does a client that never connects its streams.
    let mut b = [0u8];
    let waited = race(test.all_streams(), race(conn.read(&mut b), wisp::exec::sleep(MESSAGE_TIMEOUT))).await;
    if !matches!(waited, Either::Left(())) {
        wisp::println!("iperf: the client did not set up its streams");
        return;
    }
    test.assign();
    test.start_ns.set(now());
    test.phase.set(Phase::Running);
    if conn.write_all(&[TEST_START, TEST_RUNNING]).await.is_err() {
        return;
    }
    test.running.set();
    if let Some(sock) = &udp {
        if p.mode != Mode::Receive {
            wisp::exec::spawn(udp_send(test.clone(), sock.clone()));
        }
    }

    let limit =
        if p.time > 0 { Duration::from_secs(p.time + p.omit) + TEST_END_SLACK } else { Duration::from_secs(86_400) };
    let deadline = Instant::now().add(limit);
    // The first `omit` seconds (-O) do not count.
    let omit_end = Instant::now().add(Duration::from_secs(p.omit));
    let mut omitting = p.omit > 0;
    let state = loop {
        let wake = if omitting { omit_end } else { deadline };
        match race(read_state(&conn), wisp::exec::sleep_until(wake)).await {
            Either::Right(()) if omitting => {
                omitting = false;
                test.end_omit();
            }
            r => break r,
        }
    };
    match state {
        Either::Left(Some(TEST_END)) => {}
        Either::Left(Some(CLIENT_TERMINATE)) => {
            wisp::println!("iperf: the client ended the test");
            return;
        }
        Either::Left(Some(s)) => {
            wisp::println!("iperf: unexpected state {} from the client", s as i8);
            return;
        }
        Either::Left(None) => {
            wisp::println!("iperf: the client went away");
            return;
        }
        Either::Right(()) => {
            wisp::println!("iperf: the client did not end the test in time");
            return;
        }
    }
    test.end_ns.set(now());
    test.phase.set(Phase::Ending);
    test.stop.set();

    if conn.write_all(&[EXCHANGE_RESULTS]).await.is_err() {
        return;
    }
    let Either::Left(Some(_client_results)) = race(read_json(&conn), wisp::exec::sleep(MESSAGE_TIMEOUT)).await else {
        wisp::println!("iperf: no results from the client");
        return;
    };
    if !write_json(&conn, &test.results()).await || conn.write_all(&[DISPLAY_RESULTS]).await.is_err() {
        return;
    }
    wisp::print!("{}", test.summary());
    // The client answers IPERF_DONE and closes.
    if let Either::Left(Some(s)) = race(read_state(&conn), wisp::exec::sleep(MESSAGE_TIMEOUT)).await {
        if s != IPERF_DONE {
            wisp::println!("iperf: unexpected state {} from the client", s as i8);
        }
    }
}

/// Bind the test's UDP port (the previous test's socket may take a moment
/// to go away).
async fn bind_udp(port: u16) -> Option<UdpSocket> {
    for _ in 0..50 {
        match UdpSocket::bind(port) {
            Ok(s) => return Some(s),
            Err(wisp::net::Error::AddrInUse) => wisp::exec::sleep(Duration::from_millis(100)).await,
            Err(e) => {
                wisp::println!("iperf: cannot bind UDP port {}: {}", port, e);
                return None;
            }
        }
    }
    wisp::println!("iperf: UDP port {} stays in use", port);
    None
}

/// A block of iperf3's repeating payload.
fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| b'0' + (i % 10) as u8).collect()
}

/// Whether a stream limited to `rate` bit/s, having sent `bytes` since
/// `start`, must wait.
fn ahead(rate: u64, bytes: u64, start: u64) -> bool {
    rate > 0 && (bytes as u128) * 8 * 1_000_000_000 >= rate as u128 * now().saturating_sub(start) as u128
}

/// One TCP data stream.
async fn tcp_stream(test: Rc<Test>, conn: TcpStream, stream: Rc<Stream>) {
    if until(&test.stop, test.running.wait()).await.is_none() {
        return;
    }
    let p = *test.p();
    if !stream.sender.get() {
        let mut buf = vec![0u8; RECV_BUFFER];
        while let Some(Ok(n @ 1..)) = until(&test.stop, conn.read(&mut buf)).await {
            stream.bytes.set(stream.bytes.get() + n as u64);
        }
        return;
    }
    if p.nodelay {
        conn.set_nodelay(true);
    }
    let block = payload(p.len.min(SEND_BLOCK));
    let limit = p.send_limit().unwrap_or(u64::MAX);
    let start = now();
    let pacing = Duration::from_micros(p.pacing_us);
    while !test.stop.is_set() {
        if test.sent.get() >= limit {
            test.stop.wait().await;
            break;
        }
        if ahead(p.rate, stream.bytes.get(), start) {
            until(&test.stop, wisp::exec::sleep(pacing)).await;
            continue;
        }
        let want = (limit - test.sent.get()).min(block.len() as u64) as usize;
        match until(&test.stop, conn.write(&block[..want])).await {
            Some(Ok(n)) => {
                stream.bytes.set(stream.bytes.get() + n as u64);
                test.sent.set(test.sent.get() + n as u64);
            }
            _ => break,
        }
    }
}

/// Receive the test's UDP datagrams: streams' first datagrams while they
/// are created, data on receiving streams while it runs.
async fn udp_receive(test: Rc<Test>, sock: Rc<UdpSocket>) {
    let mut buf = vec![0u8; 2048];
    let mut seq = 0;
    let header = test.p().udp_header();
    loop {
        let (n, ip, port) = match until(&test.stop, sock.recv_from(&mut buf)).await {
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                wisp::println!("iperf: udp: {}", e);
                return;
            }
            None => return,
        };
        let arrival = wisp::time::wall_ns();
        let stream = test.streams.borrow().iter().find(|s| s.peer == Some((ip, port))).cloned();
        match stream {
            // A new stream's first datagram: answer it.
            None if n == 4 && test.add_stream(Proto::Udp, seq, Some((ip, port))).is_some() => {
                seq += 1;
                let msg = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
                let reply = if msg == LEGACY_UDP_CONNECT_MSG { LEGACY_UDP_CONNECT_REPLY } else { UDP_CONNECT_REPLY };
                let _ = sock.send_to(&reply.to_ne_bytes(), ip, port).await;
            }
            Some(s) if test.phase.get() == Phase::Running && !s.sender.get() && n >= header => {
                s.received(&buf[..n], header == 16, arrival)
            }
            _ => {}
        }
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
    fn received(&self, d: &[u8], counters64: bool, arrival: u64) {
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

/// Send on the test's sending UDP streams, each at the requested rate.
async fn udp_send(test: Rc<Test>, sock: Rc<UdpSocket>) {
    let p = *test.p();
    let header = p.udp_header();
    let mut buf = payload(p.len);
    let senders: Vec<Rc<Stream>> = test.streams.borrow().iter().filter(|s| s.sender.get()).cloned().collect();
    let limit = p.send_limit().unwrap_or(u64::MAX);
    let pacing = Duration::from_micros(p.pacing_us);
    let start = now();
    let mut burst = 0;
    while !test.stop.is_set() {
        let mut sent = false;
        for s in &senders {
            if test.sent.get() >= limit || ahead(p.rate, s.bytes.get(), start) {
                continue;
            }
            let Some((ip, port)) = s.peer else { continue };
            let t = wisp::time::wall_ns();
            let count = s.packets.get() + 1;
            buf[0..4].copy_from_slice(&((t / 1_000_000_000) as u32).to_be_bytes());
            buf[4..8].copy_from_slice(&((t % 1_000_000_000 / 1000) as u32).to_be_bytes());
            if header == 16 {
                buf[8..16].copy_from_slice(&count.to_be_bytes());
            } else {
                buf[8..12].copy_from_slice(&(count as u32).to_be_bytes());
            }
            match until(&test.stop, sock.send_to(&buf, ip, port)).await {
                Some(Ok(n)) => {
                    s.packets.set(count);
                    s.bytes.set(s.bytes.get() + n as u64);
                    test.sent.set(test.sent.get() + n as u64);
                    sent = true;
                }
                Some(Err(e)) => {
                    wisp::println!("iperf: udp: {}", e);
                    return;
                }
                None => return,
            }
        }
        if !sent {
            until(&test.stop, wisp::exec::sleep(pacing)).await;
        } else {
            burst += 1;
            if burst % 32 == 0 {
                wisp::exec::yield_now().await;
            }
        }
    }
}
