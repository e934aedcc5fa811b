//! The data streams: a TCP stream's task (receiving or sending), and the
//! tasks that receive and send the test's UDP datagrams; paced to the
//! requested rate.

use alloc::rc::Rc;
use alloc::vec;
use alloc::vec::Vec;
use core::time::Duration;

use iperf_params::{Proto, RECV_BUFFER, SEND_BLOCK};
use wisp::net::{TcpStream, UdpSocket};

use crate::protocol::{LEGACY_UDP_CONNECT_MSG, LEGACY_UDP_CONNECT_REPLY, UDP_CONNECT_REPLY};
use crate::session::{now, Phase, Stream, Test};
use crate::sync::until;

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
pub async fn tcp_stream(test: Rc<Test>, conn: TcpStream, stream: Rc<Stream>) {
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
pub async fn udp_receive(test: Rc<Test>, sock: Rc<UdpSocket>) {
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

/// Send on the test's sending UDP streams, each at the requested rate.
pub async fn udp_send(test: Rc<Test>, sock: Rc<UdpSocket>) {
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
