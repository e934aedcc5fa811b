//! Standard input: what `wisp run -i` reads on its own standard input
//! (without `-i`, input is empty: the first read returns 0). Reads block
//! the VM until bytes come or input ends, parked in the idle hypercall (no
//! CPU used meanwhile); a stop request ends the wait as it ends others.
//!
//! ```ignore
//! let mut line = alloc::string::String::new();
//! while wisp::stdin::read_line(&mut line) > 0 {
//!     wisp::print!("{}", line.to_uppercase());
//!     line.clear();
//! }
//! ```

use alloc::string::String;
use alloc::vec::Vec;

use wisp_abi::args::stdio_op;
use wisp_abi::errno;

/// Bytes read from the monitor that a line read did not take yet.
static PENDING: crate::global::Global<Vec<u8>> = crate::global::Global::new(Vec::new());

/// One read from the monitor, waiting for bytes: at least 1, or 0 at the
/// end of input.
fn read_raw(buf: &mut [u8]) -> usize {
    loop {
        let r = crate::hypercall::stdio(stdio_op::READ_IN, buf.as_mut_ptr(), buf.len());
        if r >= 0 {
            return r as usize;
        }
        if r != errno::EAGAIN {
            // No standard input here (`ENOSYS`): its end.
            return 0;
        }
        // Nothing yet: park until an event (input, or something else the
        // library OS acts on, such as a stop request), then look again.
        let events = crate::hypercall::idle(u64::MAX);
        crate::process::dispatch_events(events);
    }
}

/// One read from the monitor without waiting: `Some(n)` (0 at the end),
/// `None` if nothing is there yet.
fn try_read_raw(buf: &mut [u8]) -> Option<usize> {
    match crate::hypercall::stdio(stdio_op::READ_IN, buf.as_mut_ptr(), buf.len()) {
        r if r >= 0 => Some(r as usize),
        r if r == errno::EAGAIN => None,
        _ => Some(0),
    }
}

/// [`read_line`] for a task of the executor: the other tasks run while it
/// waits (it is woken by the `STDIN` event).
pub async fn read_line_async(line: &mut String) -> usize {
    let mut buf = [0u8; 4096];
    loop {
        if let Some(n) = take_line(line) {
            return n;
        }
        let got = core::future::poll_fn(|cx| match try_read_raw(&mut buf) {
            Some(n) => core::task::Poll::Ready(n),
            None => {
                crate::process::STDIN_READERS.with(|r| r.push(cx.waker().clone()));
                core::task::Poll::Pending
            }
        })
        .await;
        match got {
            0 => return take_rest(line),
            n => PENDING.with(|p| p.extend_from_slice(&buf[..n])),
        }
    }
}

/// The first whole line of [`PENDING`], appended to `line`: its bytes.
fn take_line(line: &mut String) -> Option<usize> {
    PENDING.with(|p| {
        let end = p.iter().position(|&b| b == b'\n').map(|i| i + 1)?;
        line.push_str(&String::from_utf8_lossy(&p[..end]));
        p.drain(..end);
        Some(end)
    })
}

/// What is left of [`PENDING`] at the end of input, appended to `line`.
fn take_rest(line: &mut String) -> usize {
    PENDING.with(|p| {
        line.push_str(&String::from_utf8_lossy(p));
        core::mem::take(p).len()
    })
}

/// Read into `buf`: the bytes read, at least 1, or 0 at the end of input.
pub fn read(buf: &mut [u8]) -> usize {
    if buf.is_empty() {
        return 0;
    }
    let n = PENDING.with(|p| {
        let n = p.len().min(buf.len());
        buf[..n].copy_from_slice(&p[..n]);
        p.drain(..n);
        n
    });
    if n > 0 {
        return n;
    }
    read_raw(buf)
}

/// Read everything to the end of input, appended to `out`; returns the
/// bytes read.
pub fn read_to_end(out: &mut Vec<u8>) -> usize {
    let mut buf = [0u8; 4096];
    let start = out.len();
    loop {
        match read(&mut buf) {
            0 => return out.len() - start,
            n => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Read one line (up to and including its `\n`, or the last bytes before
/// the end of input), appended to `line`; returns the bytes read (0: end
/// of input). Bytes that are not UTF-8 become U+FFFD.
pub fn read_line(line: &mut String) -> usize {
    let mut buf = [0u8; 4096];
    loop {
        if let Some(n) = take_line(line) {
            return n;
        }
        match read_raw(&mut buf) {
            0 => return take_rest(line),
            n => PENDING.with(|p| p.extend_from_slice(&buf[..n])),
        }
    }
}
