//! One TLS connection's state machine over rustls' unbuffered API (its
//! buffered `ServerConnection` needs `std::io`). Bytes from the peer go in
//! with [`Session::feed`]; [`Session::advance`] runs rustls until it needs
//! more of them, leaving records to send in [`Session::out`] and decrypted
//! data in the caller's buffer; [`Session::seal`] encrypts data for the
//! peer. No I/O here: the caller moves the bytes.

use alloc::sync::Arc;
use alloc::vec::Vec;

use rustls::server::{ServerConfig, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, UnbufferedStatus};

/// Most bytes received and not yet a whole record (a TLS record is at most
/// 16 KiB + 2 KiB of overhead; a peer sending more without completing one
/// is not speaking TLS).
const MAX_PENDING: usize = 18 * 1024 + 5;

/// Why a session ended.
#[derive(Debug)]
pub enum Error {
    /// rustls refused the peer's bytes (an alert was queued for it in
    /// [`Session::out`] when TLS allows one).
    Tls(rustls::Error),
    /// More than a record's worth of bytes that are not a record.
    Oversized,
    /// Application data before the handshake finished, or after close.
    NotReady,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Tls(e) => write!(f, "{}", e),
            Error::Oversized => f.write_str("more than a record of bytes that are not a TLS record"),
            Error::NotReady => f.write_str("no traffic keys (handshake not finished, or closed)"),
        }
    }
}

impl From<rustls::Error> for Error {
    fn from(e: rustls::Error) -> Error {
        Error::Tls(e)
    }
}

/// A server-side TLS session.
pub struct Session {
    conn: UnbufferedServerConnection,
    /// Bytes received and not yet consumed by rustls.
    incoming: Vec<u8>,
    /// Records to send to the peer, in order.
    pub out: Vec<u8>,
    established: bool,
    peer_closed: bool,
}

impl Session {
    pub fn new(config: Arc<ServerConfig>) -> Result<Session, Error> {
        Ok(Session { conn: UnbufferedServerConnection::new(config)?, incoming: Vec::new(), out: Vec::new(), established: false, peer_closed: false })
    }

    /// The handshake is done: application data may flow.
    pub fn established(&self) -> bool {
        self.established
    }

    /// The peer sent its close_notify: it sends nothing more.
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// Bytes from the peer.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), Error> {
        if self.incoming.len() + data.len() > MAX_PENDING + 16 * 1024 {
            return Err(Error::Oversized);
        }
        self.incoming.extend_from_slice(data);
        Ok(())
    }

    /// Run rustls over what was fed until it needs more input: handshake
    /// records to send are appended to `out`, the peer's application data
    /// to `plain`.
    pub fn advance(&mut self, plain: &mut Vec<u8>) -> Result<(), Error> {
        loop {
            let UnbufferedStatus { discard, state } = self.conn.process_tls_records(&mut self.incoming);
            let mut wait = false;
            match state {
                Err(e) => {
                    // rustls has an alert for the peer after most errors.
                    state_done(&mut self.conn, &mut self.out);
                    return Err(Error::Tls(e));
                }
                Ok(ConnectionState::ReadTraffic(mut r)) => {
                    while let Some(rec) = r.next_record() {
                        plain.extend_from_slice(rec?.payload);
                    }
                }
                Ok(ConnectionState::ReadEarlyData(mut r)) => {
                    while let Some(rec) = r.next_record() {
                        plain.extend_from_slice(rec?.payload);
                    }
                }
                Ok(ConnectionState::EncodeTlsData(mut e)) => {
                    append(&mut self.out, 4096, |buf| e.encode(buf).map_err(encode_room));
                }
                // The caller sends `out` before it waits for the peer.
                Ok(ConnectionState::TransmitTlsData(t)) => t.done(),
                Ok(ConnectionState::BlockedHandshake) => wait = true,
                Ok(ConnectionState::WriteTraffic(_)) => {
                    self.established = true;
                    wait = true;
                }
                Ok(ConnectionState::PeerClosed) => self.peer_closed = true,
                Ok(ConnectionState::Closed) => {
                    self.peer_closed = true;
                    wait = true;
                }
                Ok(_) => wait = true,
            }
            self.incoming.drain(..discard);
            if self.incoming.len() > MAX_PENDING {
                return Err(Error::Oversized);
            }
            if wait {
                return Ok(());
            }
        }
    }

    /// Encrypt `data` for the peer into `out`.
    pub fn seal(&mut self, data: &[u8]) -> Result<(), Error> {
        self.write(|w, buf| w.encrypt(data, buf), data.len())
    }

    /// Queue our close_notify in `out`.
    pub fn close(&mut self) -> Result<(), Error> {
        self.write(|w, buf| w.queue_close_notify(buf), 0)
    }

    fn write(
        &mut self,
        mut f: impl FnMut(&mut rustls::unbuffered::WriteTraffic<'_, rustls::server::ServerConnectionData>, &mut [u8]) -> Result<usize, EncryptError>,
        len: usize,
    ) -> Result<(), Error> {
        if !self.established {
            return Err(Error::NotReady);
        }
        // `advance` left no whole record behind, so rustls is at its
        // WriteTraffic state.
        let UnbufferedStatus { discard, state } = self.conn.process_tls_records(&mut self.incoming);
        let r = match state {
            Ok(ConnectionState::WriteTraffic(mut w)) => {
                // A record's overhead is 22 bytes; a record holds 16 KiB.
                let room = len + (len / 16384 + 1) * 64;
                let encrypted = append(&mut self.out, room, |buf| {
                    f(&mut w, buf).map_err(|e| match e {
                        EncryptError::InsufficientSize(s) => Some(s.required_size),
                        _ => None,
                    })
                });
                if encrypted { Ok(()) } else { Err(Error::NotReady) }
            }
            Ok(_) => Err(Error::NotReady),
            Err(e) => Err(Error::Tls(e)),
        };
        self.incoming.drain(..discard);
        r
    }
}

/// After an error, encode the alert rustls queued (if it did) into `out`.
fn state_done(conn: &mut UnbufferedServerConnection, out: &mut Vec<u8>) {
    let mut none = [0u8; 0];
    for _ in 0..4 {
        let UnbufferedStatus { state, .. } = conn.process_tls_records(&mut none);
        match state {
            Ok(ConnectionState::EncodeTlsData(mut e)) => {
                append(out, 64, |buf| e.encode(buf).map_err(encode_room));
            }
            Ok(ConnectionState::TransmitTlsData(t)) => t.done(),
            _ => return,
        }
    }
}

/// Append to `out` what `write` puts in the room it is given: first
/// `room` bytes, then as many as it says it needs (`Err(Some(n))`);
/// `Err(None)`, or a need no larger than the room it had: nothing is
/// appended, and false.
fn append(out: &mut Vec<u8>, mut room: usize, mut write: impl FnMut(&mut [u8]) -> Result<usize, Option<usize>>) -> bool {
    let at = out.len();
    loop {
        out.resize(at + room, 0);
        match write(&mut out[at..]) {
            Ok(n) => {
                out.truncate(at + n);
                return true;
            }
            Err(Some(need)) if need > room => room = need,
            Err(_) => {
                out.truncate(at);
                return false;
            }
        }
    }
}

/// The room an encoding asks for, if that is why it failed.
fn encode_room(e: EncodeError) -> Option<usize> {
    match e {
        EncodeError::InsufficientSize(s) => Some(s.required_size),
        EncodeError::AlreadyEncoded => None,
    }
}
