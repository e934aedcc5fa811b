//! Where the vCPU thread of a daemon's VMM process writes the guest's
//! console: into the ring ([`crate::console`]), and for an attached start
//! straight to the attached connection (no thread wake-up between the
//! guest's output and the socket): the daemon's, or the client's own
//! (handed over by the daemon, framed as HTTP chunks). If the reader is
//! slow (the socket would block) a streaming thread takes the connection
//! over from the ring, so the guest never waits for a client.

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use crate::console::Framing;
use crate::state::{spawn_conn, Shared};

/// Where the vCPU thread writes the guest's console: the ring, and the
/// attached connection if there is one.
pub(crate) struct Sink {
    shared: Arc<Shared>,
    direct: Option<(UnixStream, Framing)>,
    /// A chunk's frame being sent.
    frame: Vec<u8>,
    /// Told when the first output has gone out (the start's connection to
    /// the daemon, for a client's start), then dropped.
    first_out: Option<UnixStream>,
}

impl Sink {
    /// A sink for `shared`'s console; `attached` is the connection of an
    /// attached start (counted as an open connection) and how it is framed;
    /// `first_out` is told when the first output has gone out.
    pub fn new(shared: Arc<Shared>, attached: Option<(UnixStream, Framing)>, first_out: Option<UnixStream>) -> Sink {
        Sink { shared, direct: attached, frame: Vec::new(), first_out }
    }

    /// Tell the daemon that the first output went out (it stops holding
    /// back the pool's refill and keeps the time); best effort, no wait.
    fn first_output(&mut self) {
        if let Some(c) = self.first_out.take() {
            let reply = crate::proto::Reply { first_output_ns: Some(crate::monotonic_ns()), ..Default::default() };
            let mut line = serde_json::to_vec(&reply).unwrap_or_default();
            line.push(b'\n');
            let _ = send_now(&c, &line);
        }
    }

    /// Give the attached connection to a streaming thread: `pending` bytes
    /// first (the rest of a frame), then the console from byte `pos`.
    fn hand_over(&mut self, pos: u64, pending: Vec<u8>) {
        if let Some((conn, framing)) = self.direct.take() {
            spawn_conn(&self.shared, move |s| s.stream_logs(conn, true, Some(pos), framing, &pending));
        }
    }

    fn drop_direct(&mut self) {
        if let Some((conn, framing)) = self.direct.take() {
            if framing == Framing::Chunked {
                // The VM has ended: the response's end (a client too slow to
                // take five bytes loses it, not the guest's time).
                let _ = send_now(&conn, wisp_api::http::LAST_CHUNK);
            }
            self.shared.release_conn();
        }
    }

    /// In a forked child process: forget this sink without a word. The
    /// attached connection is the parent VM's (the child's monitor closed
    /// its copy with every descriptor the VM does not own, before the
    /// guest ran: `Vm::keep_in_children`), and so is the bookkeeping,
    /// which must not be touched.
    pub fn forget_in_child(self) {
        std::mem::forget(self);
    }
}

/// Send without waiting (and without SIGPIPE).
fn send_now(conn: &UnixStream, data: &[u8]) -> rustix::io::Result<usize> {
    rustix::net::send(conn, data, rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL)
}

impl Write for Sink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let total = self.shared.console.push(data);
        let Some((conn, framing)) = &self.direct else { return Ok(data.len()) };
        let framing = *framing;
        if framing == Framing::Chunked {
            wisp_api::http::chunk_frame(data, &mut self.frame);
        }
        let out: &[u8] = if framing == Framing::Chunked { &self.frame } else { data };
        let (sent, len) = (send_now(conn, out), out.len());
        self.first_output();
        // Unsent: from this byte of `out`.
        let unsent = match sent {
            Ok(n) if n == len => return Ok(data.len()),
            Ok(n) => n,
            Err(rustix::io::Errno::AGAIN) => 0,
            Err(_) => {
                self.drop_direct(); // the reader went away
                return Ok(data.len());
            }
        };
        match framing {
            // The ring has the bytes: the thread resends them from there.
            Framing::Raw => self.hand_over(total - (data.len() - unsent) as u64, Vec::new()),
            // A frame is sent whole: the thread finishes this one first.
            Framing::Chunked => {
                let rest = self.frame[unsent..].to_vec();
                self.hand_over(total, rest)
            }
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.drop_direct();
    }
}
