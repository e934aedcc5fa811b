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
//!
//! Here: accepting connections and telling a test's control connection
//! from its streams. `protocol.rs`: iperf3's wire (states, error codes,
//! messages); `params.rs`: a test's parameters and the server's sizes;
//! `session.rs`: a test, its streams and their counters, its results;
//! `control.rs`: driving a test; `streams.rs`: the data streams;
//! `sync.rs`: helpers. A test's parameters (`iperf-params`) and the JSON
//! they come in (`jsonlite`) are crates of their own, tested on the host.
#![no_std]
#![no_main]

extern crate alloc;

mod control;
mod protocol;
mod session;
mod streams;
mod sync;

use alloc::rc::Rc;
use core::cell::{Cell, RefCell};

use control::control;
use iperf_params::{socket_buffer, Proto};
use protocol::{deny, read_exact, COOKIE_SIZE, MESSAGE_TIMEOUT};
use session::Test;
use streams::tcp_stream;
use wisp::exec::{race, Either};
use wisp::net::{TcpListener, TcpOptions, TcpStream};

wisp::main!(main, wisp::Manifest::new().nic(true));

const DEFAULT_PORT: u16 = 5201;
/// Listening sockets kept ready (each holds its buffers).
const BACKLOG: usize = 4;

fn main() -> i32 {
    let (port, cfg) = match wisp::net::server_args("iperf", 1, DEFAULT_PORT) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let (used, free) = wisp::heap::usage();
    let buffer = socket_buffer(used + free);
    let opts = TcpOptions { backlog: BACKLOG, rx_buffer: buffer, tx_buffer: buffer, ..TcpOptions::default() };
    let listener = match TcpListener::bind_app("iperf", port, opts) {
        Ok(l) => l,
        Err(code) => return code,
    };
    wisp::println!("iperf: listening on {}:{} (TCP buffers {} KiB)", cfg.ip, port, buffer >> 10);
    let server = Rc::new(Server { port, buffer, current: RefCell::new(None), next_seq: Cell::new(0) });
    listener.serve_app("iperf", move |conn| {
        let seq = server.next_seq.get();
        server.next_seq.set(seq + 1);
        handle(server.clone(), conn, seq)
    })
}

struct Server {
    port: u16,
    /// TCP socket buffers, each way.
    buffer: usize,
    /// The test under way (one at a time).
    current: RefCell<Option<Rc<Test>>>,
    /// Accept order of TCP connections (orders a test's streams).
    next_seq: Cell<u64>,
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
            control(server.port, server.buffer, &test, conn).await;
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
