//! `daytime [PORT]`: the daytime service (RFC 867), as in LightVM's daytime
//! unikernel. A TCP server on port 13 (or PORT) that answers every
//! connection with the current UTC time as one line of text, e.g.
//! `Mon Nov 23 08:30:00 2026\r\n`, and closes it. Connections are served
//! concurrently; it runs until the VM is stopped.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::format;
use alloc::string::String;

use wisp::net::{TcpListener, TcpOptions, TcpStream};

wisp::main!(main, wisp::Manifest::new().nic(true));

fn main() -> i32 {
    let (port, cfg) = match wisp::net::server_args("daytime", 1, 13) {
        Ok(x) => x,
        Err(code) => return code,
    };
    // Tiny buffers: a request is never read and the answer is 26 bytes, so
    // thousands of connections fit in a few MiB. A deep backlog keeps
    // bursts of clients from being refused.
    let opts = TcpOptions { backlog: 64, rx_buffer: 256, tx_buffer: 256, nodelay: true, ..TcpOptions::default() };
    let listener = match TcpListener::bind_app("daytime", port, opts) {
        Ok(l) => l,
        Err(code) => return code,
    };
    wisp::println!("daytime: listening on {}:{}", cfg.ip, port);
    listener.serve_app("daytime", serve)
}

/// Answer one connection; dropping it closes it after the answer is sent.
async fn serve(conn: TcpStream) {
    let _ = conn.write_all(daytime(wisp::time::wall_ns()).as_bytes()).await;
}

/// `Www Mmm dd hh:mm:ss yyyy\r\n` (the C `ctime` layout), in UTC.
fn daytime(wall_ns: u64) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let (y, mo, d, h, mi, s) = wisp::time::civil(wall_ns);
    // 1970-01-01 was a Thursday.
    let weekday = (wall_ns / 1_000_000_000 / 86_400 + 4) % 7;
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {}\r\n",
        DAYS[weekday as usize],
        MONTHS[(mo as usize).clamp(1, 12) - 1],
        d,
        h,
        mi,
        s,
        y
    )
}
