//! Where the vCPU thread of a daemon's VMM process writes the guest's
//! console: into the ring ([`crate::console`]), and for an attached start
//! straight to the attached connection (no thread wake-up between the
//! guest's output and the socket): the daemon's, or the client's own
//! (handed over by the daemon, framed as HTTP chunks). If the reader is
//! slow (the socket would block) a streaming thread takes the connection
//! over from the ring, so the guest never waits for a client.
//!
//! A start is answered at the guest's first exit, not before it runs
//! ([`Deferred`]): the reply to the daemon, the client's response head
//! (sent with the first chunk, one wake-up of the client instead of two)
//! and the control socket's hand-over to its thread wait until the
//! monitor flushes the sink, which it does at the first exit (within
//! [`FIRST_EXIT_WITHIN`]: `Vm::flush_at_first_exit`).

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use crate::console::Framing;
use crate::state::{spawn_conn, Shared};

/// Longest the guest runs before its start is answered (a guest that
/// makes no exit sooner is kicked out of the guest then).
/// (Long enough that arming it rarely reprograms the CPU's timer, an exit
/// to the hypervisor on a virtualised host.)
pub(crate) const FIRST_EXIT_WITHIN: std::time::Duration = std::time::Duration::from_millis(10);

/// What a start sends once its guest has first run.
pub(crate) struct Deferred {
    /// The reply line for the daemon (on `Sink::start`, or before the
    /// console on a daemon-attached connection).
    pub reply: Vec<u8>,
    /// The client's response head (a client's start), sent with the first
    /// chunk.
    pub head: Vec<u8>,
    /// Run last (the control socket's hand-over).
    pub then: Option<Box<dyn FnOnce() + Send>>,
}

/// Where the vCPU thread writes the guest's console: the ring, and the
/// attached connection if there is one.
pub(crate) struct Sink {
    shared: Arc<Shared>,
    direct: Option<(UnixStream, Framing)>,
    /// A chunk's frame being sent.
    frame: Vec<u8>,
    /// The start's connection to the daemon when the console does not go
    /// there: answered, and for a client's start told when the first
    /// output has gone out ([`Sink::first_output`]), then dropped.
    start: Option<UnixStream>,
    /// Sent at the first write or flush.
    deferred: Option<Deferred>,
    /// Something was written to the attached connection.
    wrote: bool,
}

impl Sink {
    /// A sink for `shared`'s console; `attached` is the connection of an
    /// attached start (counted as an open connection) and how it is framed;
    /// `start` is the start's connection if the console does not go there
    /// (told when the first output has gone out if `attached` is a
    /// client's); `deferred` is sent once the guest has run.
    pub fn new(shared: Arc<Shared>, attached: Option<(UnixStream, Framing)>, start: Option<UnixStream>, deferred: Option<Deferred>) -> Sink {
        Sink { shared, direct: attached, frame: Vec::new(), start, deferred, wrote: false }
    }

    /// Send what waited for the guest's first run when it goes without
    /// console output: the reply (before any console on a daemon-attached
    /// connection), the client's head, the hand-over. A client that cannot
    /// take its head loses the console.
    fn settle(&mut self) {
        let Some(d) = self.deferred.take() else { return };
        match &self.direct {
            Some((c, Framing::Raw)) => {
                let _ = (&*c).write_all(&d.reply);
            }
            Some((c, Framing::Chunked)) => {
                if (&*c).write_all(&d.head).is_err() {
                    self.drop_direct();
                }
                self.send_start(&d.reply);
            }
            None => {
                self.send_start(&d.reply);
                self.start = None;
            }
        }
        if let Some(then) = d.then {
            then();
        }
    }

    /// A line (or lines) to the daemon on the start's connection.
    fn send_start(&mut self, line: &[u8]) {
        if let Some(c) = &self.start {
            let _ = (&*c).write_all(line);
        }
    }

    /// Tell the daemon that the first output went out (it stops holding
    /// back the pool's refill and keeps the time); best effort, no wait.
    /// (With the start's reply when that waited for this output: one
    /// message to the daemon.)
    fn first_output(&mut self, reply: &[u8]) {
        if let Some(c) = self.start.take() {
            let note = crate::proto::Reply { first_output_ns: Some(crate::monotonic_ns()), ..Default::default() };
            let mut lines = reply.to_vec();
            lines.extend(serde_json::to_vec(&note).unwrap_or_default());
            lines.push(b'\n');
            let _ = send_now(&c, &lines);
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

    /// The VM has ended with `exit`: a client's response ends with it as
    /// trailer fields (`X-Wisp-Exit`, as a recycler endpoint's does), so
    /// the client needs no `wait`. (Unless a streaming thread took the
    /// connection over: its end is the plain last chunk.)
    pub fn finish(mut self, exit: &wisp_api::ExitInfo) {
        self.settle();
        if let Some((conn, Framing::Chunked)) = &self.direct {
            let _ = send_now(conn, &wisp_api::http::exit_trailer(exit.code, &exit.reason));
            self.direct = None;
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
        // A client's first chunk carries its response head (and the daemon
        // hears of the reply with the first output); else what waited goes
        // out first.
        let mut with_chunk = match self.direct {
            Some((_, Framing::Chunked)) => self.deferred.take(),
            _ => {
                self.settle();
                None
            }
        };
        let Some((conn, framing)) = &self.direct else { return Ok(data.len()) };
        let framing = *framing;
        if framing == Framing::Chunked {
            wisp_api::http::chunk_frame(data, &mut self.frame);
            if let Some(d) = &mut with_chunk {
                self.frame.splice(0..0, std::mem::take(&mut d.head));
            }
        }
        let out: &[u8] = if framing == Framing::Chunked { &self.frame } else { data };
        let (sent, len) = (send_now(conn, out), out.len());
        let first = !std::mem::replace(&mut self.wrote, true);
        self.first_output(with_chunk.as_ref().map_or(&[][..], |d| &d.reply));
        if let Some(then) = with_chunk.and_then(|d| d.then) {
            then();
        }
        // The reader of the first output waits for it, and the scheduler
        // may queue it behind this thread (the guest runs on): let it run.
        if first {
            std::thread::yield_now();
        }
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
    /// The monitor's flush at the guest's first exit (and at its end):
    /// what waited for the guest to run goes out now.
    fn flush(&mut self) -> io::Result<()> {
        self.settle();
        Ok(())
    }
}

/// Standard error goes to its own ring (`logs --stderr`, `stderr.log`),
/// never onto a connection that carries standard output.
impl wisp_vmm::Console for Sink {
    fn write_err(&mut self, data: &[u8]) -> io::Result<()> {
        self.shared.errors.push(data);
        Ok(())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.settle();
        self.drop_direct();
    }
}
