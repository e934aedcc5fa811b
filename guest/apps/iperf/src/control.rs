//! Driving one test over its control connection: parameters, stream
//! set-up, start, end, results.

use alloc::rc::Rc;
use alloc::string::String;
use core::time::Duration;

use wisp::net::{TcpStream, UdpSocket};
use wisp::time::Instant;

use iperf_params::{Mode, Params, Proto, IENUMSTREAMS};

use crate::protocol::{
    read_json, read_state, server_error, write_json, CLIENT_TERMINATE, CREATE_STREAMS, DISPLAY_RESULTS,
    EXCHANGE_RESULTS, IPERF_DONE, MESSAGE_TIMEOUT, PARAM_EXCHANGE, TEST_END, TEST_RUNNING, TEST_START,
};
use crate::session::{now, Phase, Test};
use crate::streams::{udp_receive, udp_send};
use wisp::exec::{race, Either};

/// A test is abandoned this long after its announced end if the client
/// does not end it.
const TEST_END_SLACK: Duration = Duration::from_secs(30);

/// Drive one test over its control connection.
pub async fn control(port: u16, buffer: usize, test: &Rc<Test>, conn: TcpStream) {
    conn.set_nodelay(true);
    if conn.write_all(&[PARAM_EXCHANGE]).await.is_err() {
        return;
    }
    let Either::Left(Some(text)) = race(read_json(&conn), wisp::exec::sleep(MESSAGE_TIMEOUT)).await else {
        wisp::println!("iperf: no parameters from the client");
        return;
    };
    let obj = match jsonlite::parse(&text) {
        Ok(obj) => obj,
        Err(e) => {
            let shown = &text[..text.len().min(200)];
            wisp::println!("iperf: refusing parameters ({}): {}", e, String::from_utf8_lossy(shown));
            return;
        }
    };
    let p = match Params::from_json(&obj) {
        Ok(p) => p,
        Err(code) => {
            wisp::println!("iperf: refusing the test (iperf3 error {})", code);
            server_error(&conn, code).await;
            return;
        }
    };
    let (_, free) = wisp::heap::usage();
    let need = p.memory(buffer);
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
    wisp::println!("iperf: test: {}", p.describe(buffer));
    let _ = test.params.set(p);

    let udp = match p.proto {
        Proto::Tcp => None,
        Proto::Udp => {
            let sock = match bind_udp(port).await {
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

    let deadline = Instant::now().add(p.time_limit(TEST_END_SLACK));
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
