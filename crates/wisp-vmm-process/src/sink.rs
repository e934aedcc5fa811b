//! Where the vCPU thread of a daemon's VMM process writes the guest's
//! console: into the ring ([`crate::console`]), and for an attached start
//! straight to the attached connection (no thread wake-up between the
//! guest's output and the socket). If the reader is slow (the socket would
//! block) a streaming thread takes the connection over from the ring, so
//! the guest never waits for a client.

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use crate::state::{spawn_conn, Shared};

/// Where the vCPU thread writes the guest's console: the ring, and the
/// attached connection if there is one.
pub(crate) struct Sink {
    shared: Arc<Shared>,
    direct: Option<UnixStream>,
}

impl Sink {
    /// A sink for `shared`'s console; `attached` is the connection of an
    /// attached start (counted as an open connection).
    pub fn new(shared: Arc<Shared>, attached: Option<UnixStream>) -> Sink {
        Sink { shared, direct: attached }
    }

    /// Give the attached connection to a streaming thread, from byte `pos`.
    fn hand_over(&mut self, pos: u64) {
        if let Some(conn) = self.direct.take() {
            spawn_conn(&self.shared, move |s| s.stream_logs(conn, true, Some(pos)));
        }
    }

    fn drop_direct(&mut self) {
        if self.direct.take().is_some() {
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

impl Write for Sink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let total = self.shared.console.push(data);
        if let Some(conn) = &self.direct {
            let sent = rustix::net::send(conn, data, rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL);
            match sent {
                Ok(n) if n == data.len() => {}
                Ok(n) => self.hand_over(total - (data.len() - n) as u64),
                Err(rustix::io::Errno::AGAIN) => self.hand_over(total - data.len() as u64),
                Err(_) => self.drop_direct(), // the reader went away
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
