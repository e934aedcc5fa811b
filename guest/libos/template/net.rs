//! @NAME@: a wisp network app, a TCP server that sends back in upper case
//! what it reads. Boot it through wispd with a port forwarded:
//! `wisp run -d --net -p 8070:7070 .`, then `nc 127.0.0.1 8070`.
//! `@NAME@ [PORT]` listens on PORT instead of 7070.
//! The library OS guide: docs/libos.md in the wisp repository.
#![no_std]
#![no_main]

extern crate alloc;

use wisp::net::{TcpListener, TcpOptions, TcpStream};

wisp::main!(main, wisp::Manifest::new().nic(true));

fn main() -> i32 {
    // The port from argument 1 (default 7070) and the NIC's address; on a
    // bad argument or without a NIC, the reason is printed and the exit
    // code returned.
    let (port, cfg) = match wisp::net::server_args("@NAME@", 1, 7070) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let listener = match TcpListener::bind_app("@NAME@", port, TcpOptions::default()) {
        Ok(l) => l,
        Err(code) => return code,
    };
    wisp::println!("@NAME@: listening on {}:{}", cfg.ip, port);
    // Each connection runs as a task of its own until the peer closes it.
    listener.serve_app("@NAME@", serve)
}

async fn serve(conn: TcpStream) {
    let mut buf = [0u8; 2048];
    loop {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                buf[..n].make_ascii_uppercase();
                if conn.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
