//! `echo [PORT]`: the echo service (RFC 862) over TCP and UDP on port 7 (or
//! PORT). TCP connections get back every byte they send until they close;
//! UDP datagrams are sent back to their sender. Runs until the VM is
//! stopped.
#![no_std]
#![no_main]

use wisp::net::{TcpListener, TcpOptions, TcpStream, UdpSocket};

wisp::main!(main);

fn main() -> i32 {
    let port = match wisp::env::arg(1).map(str::parse::<u16>) {
        None => 7,
        Some(Ok(p)) if p != 0 => p,
        Some(_) => {
            wisp::println!("usage: echo [PORT]");
            return 2;
        }
    };
    let Some(cfg) = wisp::net::config() else {
        wisp::println!("echo: no network device (run with a NIC)");
        return 1;
    };
    // Echoes are answers: send them at once rather than coalescing.
    let opts = TcpOptions { nodelay: true, ..TcpOptions::default() };
    let listener = match TcpListener::bind_with(port, opts) {
        Ok(l) => l,
        Err(e) => {
            wisp::println!("echo: cannot listen on TCP port {}: {}", port, e);
            return 1;
        }
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
    wisp::exec::block_on(async move {
        loop {
            match listener.accept().await {
                Ok(conn) => wisp::exec::spawn(serve(conn)),
                Err(e) => {
                    wisp::println!("echo: accept: {}", e);
                    return 1;
                }
            }
        }
    })
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
