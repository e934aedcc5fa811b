//! The iperf app's test parameters (iperf3's PARAM_EXCHANGE message, read
//! with `jsonlite`), checked against the server's sizes that bound them and
//! decide what a test costs. A crate of its own (`no_std`, no wisp-libos)
//! so that `make test` tests it on the host.
#![cfg_attr(not(test), no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use core::time::Duration;

use jsonlite::Object;

// iperf3's error codes (i_errno, iperf_api.h) a refused test is answered
// with after SERVER_ERROR.
pub const IEDURATION: i32 = 5;
pub const IENUMSTREAMS: i32 = 6;
pub const IEBLOCKSIZE: i32 = 7;
pub const IEOMIT: i32 = 12;
pub const IENOSCTP: i32 = 18;

/// Longest test and longest omitted start, in seconds: iperf3's own limits
/// (`MAX_TIME`, `MAX_OMIT_TIME`), which its client enforces and a hostile
/// one need not.
pub const MAX_TIME: u64 = 86_400;
pub const MAX_OMIT: u64 = 600;
/// How long a test without a time limit (`-n`, `-k`) may run.
const UNTIMED_LIMIT: Duration = Duration::from_secs(86_400);

/// Largest UDP payload that fits one frame (the stack does not reassemble
/// IP fragments).
pub const MAX_DATAGRAM: usize = wisp_abi::net::MTU as usize - 20 - 8;
/// Smallest and largest TCP socket buffer (see [`socket_buffer`]).
pub const MIN_SOCKET_BUFFER: usize = 128 << 10;
pub const MAX_SOCKET_BUFFER: usize = 256 << 10;

/// TCP socket buffers (the largest window we advertise) for a VM whose
/// heap holds `heap` bytes. Linux grows a connection's buffers as its
/// bandwidth-delay product asks (up to 6 MiB); smoltcp's are fixed when
/// the socket is made, so the server sizes them once from the RAM it was
/// given: a 32nd of the heap, a power of two between 128 KiB and 256 KiB
/// (reached by the default 16 MiB VM). A 128 KiB window held host-to-VM
/// TCP at 128 KiB messages to ~10 Gbit/s here, 256 KiB to ~15 and 512 KiB
/// to ~20; but the larger the window, the smaller the host's frames when
/// its writes are small (1 KiB messages: 16 KB a frame at 128 KiB, 6 KB at
/// 512 KiB), and the guest's cost is per frame: 2.9, 2.5 and 2.2 Gbit/s
/// (`docs/networking.md`).
pub fn socket_buffer(heap: usize) -> usize {
    let share = (heap / 32).max(1);
    let pow2 = 1usize << (usize::BITS - 1 - share.leading_zeros());
    pow2.clamp(MIN_SOCKET_BUFFER, MAX_SOCKET_BUFFER)
}
/// Largest block a TCP sending stream writes at once.
pub const SEND_BLOCK: usize = 128 << 10;
/// A TCP receiving stream's read buffer.
pub const RECV_BUFFER: usize = 32 << 10;
/// Heap a test leaves free (control connection, refilled listening
/// sockets, messages).
const HEAP_RESERVE: usize = 2 << 20;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Proto {
    Tcp,
    Udp,
}

/// Which way data flows, from the server's point of view.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// The client sends (the default).
    Receive,
    /// The server sends (`-R`).
    Send,
    /// Both (`--bidir`): the first half of the streams carry data from the
    /// client, the second half to it.
    Both,
}

/// A test's parameters, from the client's PARAM_EXCHANGE message.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub proto: Proto,
    pub mode: Mode,
    /// Streams per direction (`-P`).
    pub parallel: usize,
    /// Seconds (`-t`; 0 when the test ends by bytes or blocks).
    pub time: u64,
    pub omit: u64,
    /// Bytes to send in all (`-n`), 0 for no limit.
    num: u64,
    /// Blocks to send in all (`-k`), 0 for no limit.
    blocks: u64,
    /// Block (TCP) or datagram (UDP) size (`-l`).
    pub len: usize,
    /// Bits per second per sending stream (`-b`), 0 for unlimited.
    pub rate: u64,
    /// Pacing interval of a rate-limited sender.
    pub pacing_us: u64,
    /// Requested socket buffer size (`-w`); informational.
    window: u64,
    pub nodelay: bool,
    counters64: bool,
    pub server_output: bool,
}

impl Params {
    /// The parameters of `j`, or the iperf3 error code to refuse them with.
    pub fn from_json(j: &Object) -> Result<Params, i32> {
        let proto = if j.flag("udp") {
            Proto::Udp
        } else if j.flag("sctp") {
            return Err(IENOSCTP);
        } else {
            Proto::Tcp
        };
        let mode = match (j.has("reverse"), j.has("bidirectional")) {
            (_, true) => Mode::Both,
            (true, false) => Mode::Send,
            _ => Mode::Receive,
        };
        let int = |k: &str, default: i64| j.int(k).unwrap_or(default).max(0) as u64;
        let default_len = match proto {
            Proto::Tcp => 128 << 10,
            Proto::Udp => 1460,
        };
        let p = Params {
            proto,
            mode,
            parallel: int("parallel", 1).clamp(1, 128) as usize,
            time: int("time", 10),
            omit: int("omit", 0),
            num: int("num", 0),
            blocks: int("blockcount", 0),
            len: match int("len", 0) {
                0 => default_len,
                n => n.min(1 << 30) as usize,
            },
            rate: int("bandwidth", 0),
            pacing_us: int("pacing_timer", 1000).clamp(100, 1_000_000),
            window: int("window", 0),
            nodelay: j.has("nodelay"),
            counters64: j.has("udp_counters_64bit"),
            server_output: j.has("get_server_output"),
        };
        if p.proto == Proto::Udp && (p.len > MAX_DATAGRAM || p.len < p.udp_header()) {
            // The stack neither fragments nor reassembles datagrams.
            return Err(IEBLOCKSIZE);
        }
        if p.time > MAX_TIME {
            return Err(IEDURATION);
        }
        if p.omit > MAX_OMIT {
            return Err(IEOMIT);
        }
        Ok(p)
    }

    /// How long the test may run before the server gives up on a client
    /// that does not end it: its time, the omitted start and `slack`.
    pub fn time_limit(&self, slack: Duration) -> Duration {
        if self.time > 0 {
            Duration::from_secs(self.time + self.omit) + slack
        } else {
            UNTIMED_LIMIT
        }
    }

    /// Streams in all.
    pub fn streams(&self) -> usize {
        match self.mode {
            Mode::Both => 2 * self.parallel,
            _ => self.parallel,
        }
    }

    /// Bytes the server sends in all before it stops, if limited.
    pub fn send_limit(&self) -> Option<u64> {
        match (self.num, self.blocks) {
            (0, 0) => None,
            (0, k) => Some(k.saturating_mul(self.len as u64)),
            (n, _) => Some(n),
        }
    }

    /// Heap the test needs with TCP socket buffers of `buffer` bytes: each
    /// TCP stream holds its socket's buffers and one block, and the server
    /// keeps some in reserve.
    pub fn memory(&self, buffer: usize) -> usize {
        let per_stream = match self.proto {
            Proto::Tcp => 2 * buffer + self.len.clamp(RECV_BUFFER, SEND_BLOCK),
            Proto::Udp => 256,
        };
        self.streams() * per_stream + HEAP_RESERVE
    }

    /// Size of the UDP header: seconds, microseconds, packet counter.
    pub fn udp_header(&self) -> usize {
        if self.counters64 {
            16
        } else {
            12
        }
    }

    /// The test in words, with the server's socket buffers (`buffer`).
    pub fn describe(&self, buffer: usize) -> String {
        let dir = match self.mode {
            Mode::Receive => "receiving",
            Mode::Send => "sending (reverse)",
            Mode::Both => "both ways",
        };
        let mut s = format!(
            "{:?}, {} stream(s), {}, {} byte blocks",
            self.proto, self.parallel, dir, self.len
        );
        if self.time > 0 {
            s += &format!(", {} s", self.time);
        }
        if self.rate > 0 {
            s += &format!(", {} bit/s", self.rate);
        }
        if self.window > 0 {
            s += &format!(
                ", window {} requested (buffers are {} KiB)",
                self.window,
                buffer >> 10
            );
        }
        s
    }
}

#[cfg(test)]
mod tests;
