//! Standard error and standard input (the `stdio` hypercall, feature
//! `STDIO`): the guest's stderr goes to its embedder's [`Console`] beside
//! its stdout, and its stdin is a buffer the embedder feeds from another
//! thread ([`StdinFeed`]: a terminal, a client's request body). Reads never
//! block the vCPU: an empty buffer answers `EAGAIN`, and the feed posts
//! [`wisp_abi::events::STDIN`] so the guest's idle returns when bytes come.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex};

use wisp_abi::args::{self, stdio_op, CONSOLE_WRITE_MAX};
use wisp_abi::{errno, Hypercall};

use super::hypercall::{bad, read_block, write_block, Served};
use super::Vm;
use crate::control::Control;
use crate::fault::StopReason;
use crate::memory::RamView;

/// Where a VM's output goes: its stdout through [`Write`], its stderr
/// through [`Console::write_err`].
pub trait Console: Write {
    /// Write the guest's standard-error bytes.
    fn write_err(&mut self, data: &[u8]) -> io::Result<()>;
}

/// Both streams into one buffer (tests, and embedders that keep one log).
impl Console for Vec<u8> {
    fn write_err(&mut self, data: &[u8]) -> io::Result<()> {
        self.extend_from_slice(data);
        Ok(())
    }
}

/// Bytes of standard input buffered before the feed waits for the guest.
const STDIN_BUFFER: usize = 256 * 1024;

#[derive(Default)]
struct Buffer {
    bytes: VecDeque<u8>,
    ended: bool,
}

struct Shared {
    buf: Mutex<Buffer>,
    /// The feed waits here while the buffer is full.
    room: Condvar,
    control: Arc<Control>,
}

/// The writing end of a VM's standard input ([`Vm::attach_stdin`]): bytes
/// pushed here are what the guest reads; dropping it (or
/// [`StdinFeed::end`]) is the end of input.
pub struct StdinFeed(Arc<Shared>);

impl StdinFeed {
    /// Add bytes for the guest; waits while [`STDIN_BUFFER`] bytes are
    /// unread (a guest that never reads holds up only its feeder).
    pub fn push(&self, mut data: &[u8]) {
        while !data.is_empty() {
            let mut b = self.0.buf.lock().unwrap_or_else(|e| e.into_inner());
            while b.bytes.len() >= STDIN_BUFFER && !b.ended {
                b = self.0.room.wait(b).unwrap_or_else(|e| e.into_inner());
            }
            if b.ended {
                return;
            }
            let n = data.len().min(STDIN_BUFFER - b.bytes.len());
            b.bytes.extend(&data[..n]);
            data = &data[n..];
            drop(b);
            self.0.control.post_events(wisp_abi::events::STDIN);
        }
    }

    /// The end of input: the guest reads what is left, then 0.
    pub fn end(&self) {
        self.0.buf.lock().unwrap_or_else(|e| e.into_inner()).ended = true;
        self.0.room.notify_all();
        self.0.control.post_events(wisp_abi::events::STDIN);
    }
}

impl Drop for StdinFeed {
    fn drop(&mut self) {
        self.end();
    }
}

/// A VM's standard input as the vCPU thread reads it.
pub(super) struct Stdin(Arc<Shared>);

impl Stdin {
    /// Up to `max` bytes; `None` if none are there yet and input goes on.
    fn take(&self, max: usize) -> Option<Vec<u8>> {
        let mut b = self.0.buf.lock().unwrap_or_else(|e| e.into_inner());
        if b.bytes.is_empty() {
            return if b.ended { Some(Vec::new()) } else { None };
        }
        let n = max.min(b.bytes.len());
        let out: Vec<u8> = b.bytes.drain(..n).collect();
        self.0.room.notify_all();
        Some(out)
    }
}

impl Drop for Stdin {
    fn drop(&mut self) {
        // The feeder must not wait for a reader that is gone.
        self.0.buf.lock().unwrap_or_else(|e| e.into_inner()).ended = true;
        self.0.room.notify_all();
    }
}

impl Vm {
    /// Give the guest a standard input, fed through the returned
    /// [`StdinFeed`]. Without one the guest reads end of input at once. A
    /// forked child has none (the parent keeps it).
    pub fn attach_stdin(&mut self) -> StdinFeed {
        let shared = Arc::new(Shared { buf: Mutex::new(Buffer::default()), room: Condvar::new(), control: self.control.clone() });
        self.stdin = Some(Stdin(shared.clone()));
        StdinFeed(shared)
    }

    /// The `stdio` hypercall.
    pub(super) fn stdio(&mut self, gpa: u64, declared: bool, console: &mut dyn Console) -> Served {
        let hc = Hypercall::Stdio;
        let ram: &RamView = &self.shell.ram;
        let mut a: args::Stdio = read_block(ram, &self.user, hc, gpa, true)?;
        if !declared {
            a.ret = errno::ENOSYS;
            return write_block(ram, hc, gpa, &a);
        }
        let readable = |len: u64| ram.contains(a.data, len) && self.user.readable(a.data, len);
        a.ret = match a.op {
            stdio_op::WRITE_ERR => {
                if a.len > CONSOLE_WRITE_MAX {
                    return Err(bad(hc, format!("length {} exceeds the {CONSOLE_WRITE_MAX}-byte limit", a.len)));
                }
                if !readable(a.len) {
                    return Err(bad(hc, format!("buffer {:#x}+{:#x} is not in memory the guest may read", a.data, a.len)));
                }
                let mut buf = vec![0u8; a.len as usize];
                ram.read(a.data, &mut buf).map_err(|e| bad(hc, e.to_string()))?;
                let _ = console.write_err(&buf);
                a.len as i64
            }
            stdio_op::READ_IN => {
                let len = a.len.min(CONSOLE_WRITE_MAX);
                if !readable(len) || !self.user.writable(a.data, len) {
                    return Err(bad(hc, format!("buffer {:#x}+{:#x} is not in memory the guest may write", a.data, len)));
                }
                match self.stdin.as_ref().map(|s| s.take(len as usize)) {
                    None => 0,
                    Some(None) => errno::EAGAIN,
                    Some(Some(bytes)) => {
                        ram.write(a.data, &bytes).map_err(|e| bad(hc, e.to_string()))?;
                        bytes.len() as i64
                    }
                }
            }
            op => return Err(StopReason::BadHypercall { call: hc.name(), detail: format!("unknown operation {op}") }),
        };
        write_block(ram, hc, gpa, &a)
    }
}
