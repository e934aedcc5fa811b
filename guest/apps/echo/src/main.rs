//! `echo [PORT]`: the echo service (RFC 862) over TCP and UDP on port 7 (or
//! PORT). TCP connections get back every byte they send until they close;
//! UDP datagrams are sent back to their sender. Runs until the VM is
//! stopped.
//!
//! `echo client IP PORT MESSAGE`: connect to an echo service, send MESSAGE,
//! print the reply as `echo: reply: ...` and exit 0 if it came back intact
//! (used to test VM-to-VM traffic).
#![no_std]
#![no_main]

extern crate alloc;

use wisp::net::{TcpListener, TcpOptions, TcpStream, UdpSocket};

wisp::main!(main, wisp::Manifest::new().nic(true));

fn main() -> i32 {
    if wisp::env::arg(1) == Some("client") {
        return client();
    }
    let (port, cfg) = match wisp::net::server_args("echo", 1, 7) {
        Ok(x) => x,
        Err(code) => return code,
    };
    // Echoes are answers: send them at once rather than coalescing.
    let opts = TcpOptions { nodelay: true, ..TcpOptions::default() };
    let listener = match TcpListener::bind_app("echo", port, opts) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let udp = match UdpSocket::bind(port) {
        Ok(s) => s,
        Err(e) => {
            wisp::println!("echo: cannot bind UDP port {}: {}", port, e);
            return 1;
        }
    };
    wisp::println!("echo: listening on {}:{}", cfg.ip, port);
    wisp::exec::spawn(async move {
        let mut buf = [0u8; 2048];
        loop {
            match udp.recv_from(&mut buf).await {
                Ok((n, ip, port)) => {
                    let _ = udp.send_to(&buf[..n], ip, port).await;
                }
                Err(e) => {
                    wisp::println!("echo: udp: {}", e);
                    return;
                }
            }
        }
    });
    listener.serve_app("echo", serve)
}

/// Echo one TCP connection until the peer closes it (then close ours).
async fn serve(conn: TcpStream) {
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if conn.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn client() -> i32 {
    let (Some(ip), Some(port), Some(msg)) = (
        wisp::env::arg(2).and_then(|a| a.parse::<core::net::Ipv4Addr>().ok()),
        wisp::env::arg(3).and_then(|a| a.parse::<u16>().ok()),
        wisp::env::arg(4),
    ) else {
        wisp::println!("usage: echo client IP PORT MESSAGE");
        return 2;
    };
    wisp::exec::block_on(async move {
        let conn = match TcpStream::connect(ip, port).await {
            Ok(c) => c,
            Err(e) => {
                wisp::println!("echo: connect {}:{}: {}", ip, port, e);
                return 1;
            }
        };
        if let Err(e) = conn.write_all(msg.as_bytes()).await {
            wisp::println!("echo: send: {}", e);
            return 1;
        }
        conn.shutdown();
        let mut got = alloc::vec::Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => {
                    wisp::println!("echo: receive: {}", e);
                    return 1;
                }
            }
        }
        let reply = core::str::from_utf8(&got).unwrap_or("<not UTF-8>");
        wisp::println!("echo: reply: {}", reply);
        if got == msg.as_bytes() { 0 } else { 1 }
    })
}
