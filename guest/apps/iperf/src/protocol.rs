//! iperf3's control protocol on the wire (`iperf_api.c`): the session
//! cookie, the one-byte states, the error codes sent after SERVER_ERROR,
//! the UDP "connect" datagrams, and reading and writing the messages of a
//! control connection.

use alloc::vec;
use alloc::vec::Vec;
use core::time::Duration;

use wisp::net::TcpStream;

/// The client's session cookie: 36 characters and a NUL.
pub const COOKIE_SIZE: usize = 37;

// Control states (iperf_api.h).
pub const TEST_START: u8 = 1;
pub const TEST_RUNNING: u8 = 2;
pub const TEST_END: u8 = 4;
pub const PARAM_EXCHANGE: u8 = 9;
pub const CREATE_STREAMS: u8 = 10;
pub const CLIENT_TERMINATE: u8 = 12;
pub const EXCHANGE_RESULTS: u8 = 13;
pub const DISPLAY_RESULTS: u8 = 14;
pub const IPERF_DONE: u8 = 16;
pub const ACCESS_DENIED: u8 = -1i8 as u8;
pub const SERVER_ERROR: u8 = -2i8 as u8;

/// The UDP "connect" datagram and the answer, as x86 iperf3 sends them
/// (an int in host order): "9876" and "6789"; before 3.11: 123456789 and
/// 987654321.
pub const UDP_CONNECT_REPLY: u32 = 0x3938_3736;
pub const LEGACY_UDP_CONNECT_MSG: u32 = 123_456_789;
pub const LEGACY_UDP_CONNECT_REPLY: u32 = 987_654_321;
/// Longest JSON message accepted from a client.
const MAX_JSON: usize = 256 << 10;
/// How long a new connection may take to send its cookie, and the client
/// to send its parameters and results.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn deny(conn: TcpStream) {
    let _ = conn.write_all(&[ACCESS_DENIED]).await;
}

pub async fn read_exact(conn: &TcpStream, buf: &mut [u8]) -> Result<(), ()> {
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
pub async fn read_state(conn: &TcpStream) -> Option<u8> {
    let mut b = [0u8];
    read_exact(conn, &mut b).await.ok().map(|_| b[0])
}

/// A JSON message: 4-byte big-endian length, then the text.
pub async fn read_json(conn: &TcpStream) -> Option<Vec<u8>> {
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

pub async fn write_json(conn: &TcpStream, text: &str) -> bool {
    let mut msg = Vec::with_capacity(4 + text.len());
    msg.extend_from_slice(&(text.len() as u32).to_be_bytes());
    msg.extend_from_slice(text.as_bytes());
    conn.write_all(&msg).await.is_ok()
}

/// Refuse the test: SERVER_ERROR, iperf3's error code and an errno.
pub async fn server_error(conn: &TcpStream, code: i32) {
    let mut msg = [0u8; 9];
    msg[0] = SERVER_ERROR;
    msg[1..5].copy_from_slice(&code.to_be_bytes());
    let _ = conn.write_all(&msg).await;
}
