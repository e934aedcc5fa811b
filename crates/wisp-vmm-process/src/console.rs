//! The guest's console in a daemon's VMM process: a ring of the last
//! [`CONSOLE_RING`] bytes, for `logs` (streamed, and followed until the VM
//! ends) and for `console.log` when the VM ends. The vCPU thread writes it
//! through a [`crate::sink::Sink`].

use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Bytes of console output kept per VM.
pub const CONSOLE_RING: usize = 64 * 1024;

struct Ring {
    buf: VecDeque<u8>,
    /// Bytes ever written.
    total: u64,
}

/// How console bytes go out on a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// As they are (to the daemon, which frames them for its client).
    Raw,
    /// As the chunks of an HTTP response, ended by the last chunk when the
    /// VM ends: an attached client's own connection, handed over by the
    /// daemon with the response's head already written.
    Chunked,
}

/// The console ring and its readers' condition variable.
pub(crate) struct Console {
    ring: Mutex<Ring>,
    cv: Condvar,
}

impl Console {
    pub fn new() -> Console {
        Console { ring: Mutex::new(Ring { buf: VecDeque::new(), total: 0 }), cv: Condvar::new() }
    }

    /// Append guest output (keeping the last [`CONSOLE_RING`] bytes); returns
    /// the bytes ever written.
    pub fn push(&self, data: &[u8]) -> u64 {
        let mut c = self.ring.lock().unwrap();
        c.total += data.len() as u64;
        let keep = data.len().min(CONSOLE_RING);
        let over = (c.buf.len() + keep).saturating_sub(CONSOLE_RING);
        c.buf.drain(..over);
        c.buf.extend(&data[data.len() - keep..]);
        self.cv.notify_all();
        c.total
    }

    /// Write what the ring holds to `w`.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let c = self.ring.lock().unwrap();
        let (a, b) = c.buf.as_slices();
        w.write_all(a).and_then(|_| w.write_all(b))
    }

    /// Wake the readers (the VM has ended).
    pub fn wake(&self) {
        self.cv.notify_all();
    }

    /// Stream console output to `conn` from byte `from` (default: the oldest
    /// buffered); with `follow`, new output too until `exited` says the VM
    /// has ended. `pending` (bytes of a frame a writer began) goes first;
    /// with [`Framing::Chunked`] the stream ends with the last chunk.
    pub fn stream(
        &self,
        mut conn: UnixStream,
        follow: bool,
        from: Option<u64>,
        exited: impl Fn() -> bool,
        framing: Framing,
        pending: &[u8],
    ) -> io::Result<()> {
        conn.write_all(pending)?;
        let mut frame = Vec::new();
        let mut pos = {
            let c = self.ring.lock().unwrap();
            from.unwrap_or(c.total - c.buf.len() as u64)
        };
        loop {
            let chunk = {
                let mut c = self.ring.lock().unwrap();
                loop {
                    let start = c.total - c.buf.len() as u64;
                    pos = pos.max(start);
                    if pos < c.total {
                        let from = (pos - start) as usize;
                        let (a, b) = c.buf.as_slices();
                        let mut v = Vec::with_capacity(c.buf.len() - from);
                        if from < a.len() {
                            v.extend_from_slice(&a[from..]);
                            v.extend_from_slice(b);
                        } else {
                            v.extend_from_slice(&b[from - a.len()..]);
                        }
                        pos = c.total;
                        break v;
                    }
                    if !follow || exited() {
                        drop(c);
                        if framing == Framing::Chunked {
                            conn.write_all(wisp_api::http::LAST_CHUNK)?;
                        }
                        return Ok(());
                    }
                    c = self.cv.wait_timeout(c, Duration::from_millis(200)).unwrap().0;
                }
            };
            match framing {
                Framing::Raw => conn.write_all(&chunk)?,
                Framing::Chunked => {
                    wisp_api::http::chunk_frame(&chunk, &mut frame);
                    conn.write_all(&frame)?;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contents(c: &Console) -> Vec<u8> {
        let mut v = Vec::new();
        c.write_to(&mut v).unwrap();
        v
    }

    #[test]
    fn the_ring_keeps_the_last_bytes() {
        let c = Console::new();
        assert_eq!(c.push(b"hello "), 6);
        assert_eq!(c.push(b"world"), 11);
        assert_eq!(contents(&c), b"hello world");
        let big = vec![b'x'; CONSOLE_RING + 10];
        assert_eq!(c.push(&big), 11 + big.len() as u64);
        assert_eq!(contents(&c), vec![b'x'; CONSOLE_RING]);
        c.push(b"end");
        let v = contents(&c);
        assert_eq!(v.len(), CONSOLE_RING);
        assert!(v.ends_with(b"xxend"));
    }

    #[test]
    fn streaming_starts_where_asked_and_ends_with_the_vm() {
        let c = Console::new();
        c.push(b"0123456789");
        let (a, mut b) = UnixStream::pair().unwrap();
        c.stream(a, false, Some(4), || true, Framing::Raw, b"").unwrap();
        let mut got = String::new();
        io::Read::read_to_string(&mut b, &mut got).unwrap();
        assert_eq!(got, "456789");
        let (a, mut b) = UnixStream::pair().unwrap();
        c.stream(a, true, None, || true, Framing::Raw, b"").unwrap();
        let mut got = String::new();
        io::Read::read_to_string(&mut b, &mut got).unwrap();
        assert_eq!(got, "0123456789");
        // To a client: what a writer left of its frame, then chunks, then the end.
        let (a, mut b) = UnixStream::pair().unwrap();
        c.stream(a, true, Some(8), || true, Framing::Chunked, b"3\r\nxyz\r\n").unwrap();
        let mut got = String::new();
        io::Read::read_to_string(&mut b, &mut got).unwrap();
        assert_eq!(got, "3\r\nxyz\r\n2\r\n89\r\n0\r\n\r\n");
    }
}
