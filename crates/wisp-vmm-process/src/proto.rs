//! The daemon ↔ VMM-process protocol: one request per connection on the
//! VMM process's control socket (`<state>/vms/<id>/ctl.sock`), a JSON line
//! each way, optionally a file descriptor (the image) passed with the
//! request, and for `logs` a raw byte stream after the reply line.
//!
//! Each side treats the other's lines as untrusted input: a line longer
//! than [`MAX_LINE`] is refused (never buffered whole), and so are more
//! than [`MAX_FDS`] descriptors with one request. The daemon's side of a
//! family uplink neither waits to read nor to answer ([`try_recv_packet`],
//! [`try_send_packet`]).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};
use wisp_api::ExitInfo;

/// Largest request or reply line accepted (without its newline).
pub const MAX_LINE: usize = 64 * 1024;

/// A request to a VMM process.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Load the image passed with the request (none if `preloaded`: the
    /// one the shell holds) and run it; with `attach`, stream the console
    /// after the reply (as `logs` with `follow`).
    Start {
        image_name: String,
        /// The shell's preloaded image (`Preload`), which has this name;
        /// no image descriptor comes.
        #[serde(default)]
        preloaded: bool,
        /// The first descriptor is a snapshot (a sealed memfd) to restore
        /// instead of an image: the VM goes on from it (`args` unused).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        restore: bool,
        /// An incremental snapshot's bases: this many more descriptors
        /// right after it, oldest (a full snapshot) first.
        #[serde(default, skip_serializing_if = "is_zero")]
        bases: u32,
        args: Vec<String>,
        timeout_ms: Option<u64>,
        #[serde(default)]
        attach: bool,
        /// A NIC on the tap passed as the second descriptor.
        #[serde(default)]
        net: Option<NetSpec>,
        /// Further NICs (with `net` only), each on a tap passed right
        /// after the first NIC's, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        links: Vec<NetSpec>,
        /// The family's uplink to the daemon comes as the last descriptor:
        /// the guest may fork.
        #[serde(default)]
        uplink: bool,
        /// Most VMs in the family (default: the monitor's maximum).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        family_limit: Option<u32>,
        /// The API client's own connection comes as the last descriptor:
        /// once the reply is sent the VMM process writes this response
        /// head to it, then the console as HTTP chunks until the VM ends
        /// (the daemon is out of the path), then the last chunk. After the
        /// start's reply a second line on its connection tells when the
        /// first output went out (`Reply::first_output_ns`); the connection
        /// closes without it if the VM printed nothing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_head: Option<String>,
        /// The guest's environment and files come as the last descriptor
        /// (a sealed memfd holding `wisp_abi::data`'s region).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        data: bool,
        /// Keep the guest's standard input open for a `stdin` request.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stdin: bool,
        /// The guest's disks, one descriptor each after all the others:
        /// read-only or not.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        volumes: Vec<bool>,
        /// Make the VM a template: the very last descriptor is where its
        /// snapshot goes (a pipe's write end) when its guest says it is
        /// ready; the VM ends then.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        template: bool,
        /// A restore held before it runs (a migration's destination, while
        /// the source takes the last increment): the snapshot's pages are
        /// mapped and the devices placed, the reply says `paused`, and the
        /// VM waits on this connection for [`Request::Continue`] (anything
        /// else, or the connection's end, ends the process).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        hold: bool,
        /// Shared libraries to map, by name: one descriptor each (a sealed
        /// memfd of the library file) right after the volumes'.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        libs: Vec<String>,
    },
    /// On a held start's connection: lay the increment passed (a sealed
    /// memfd, made over the snapshot held) over the restore and run the VM;
    /// answered as a start is.
    Continue,
    /// To a group VMM process (`wispd __worker --group N`): run one more VM
    /// of its own, `vm`, in its own KVM VM on a thread of its own. The
    /// descriptors: the VM's `exit.json` and `console.log` (opened by the
    /// daemon), the listener of its control socket (bound by the daemon),
    /// the image and, with `client_head`, the API client's connection (as
    /// for [`Request::Start`]). The reply comes once the VM runs; with
    /// `attach` the console follows on the same connection.
    Host {
        vm: String,
        image_name: String,
        args: Vec<String>,
        timeout_ms: Option<u64>,
        #[serde(default)]
        attach: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_head: Option<String>,
        /// As for [`Request::Start`]: the environment and files, last.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        data: bool,
        /// As for [`Request::Start`].
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stdin: bool,
        /// As for [`Request::Start`]: shared libraries, one descriptor each,
        /// last (a recycling group's runs: the application library).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        libs: Vec<String>,
        /// Its NIC, whose tap's descriptor comes right after the image's
        /// (not in a recycling group).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        net: Option<NetSpec>,
        /// Further NICs (with `net` only), each on a tap passed right
        /// after the first NIC's, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        links: Vec<NetSpec>,
    },
    /// To a recycling group: serve a recycler endpoint (`endpoint.rs`). The
    /// descriptors: the endpoint's listening socket (bound by the daemon),
    /// the image, then the libraries, one each. Answered once the recycler
    /// is at its ready point; the endpoint lives as long as this
    /// connection stays open.
    Serve { image_name: String, libs: Vec<String> },
    /// A pooled shell: load the image passed with the request ahead of a
    /// start (the one most likely asked for), and touch its pages.
    Preload { image_name: String },
    /// Current state.
    Status,
    /// Pause the vCPU.
    Pause,
    /// Resume the vCPU.
    Resume,
    /// Ask the guest to stop (event), kill it after `grace_ms`.
    Stop { grace_ms: u64 },
    /// Stop the guest now.
    Kill,
    /// Console output: the buffered bytes, then (if `follow`) new bytes
    /// until the VM ends; standard error's instead of standard output's
    /// with `stderr`.
    Logs {
        follow: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stderr: bool,
    },
    /// Reply when the VM has exited.
    Wait,
    /// The descriptor (an API client's connection) carries the guest's
    /// standard input from now on: its bytes until its end. Once per VM,
    /// and only for a VM started with `stdin`.
    Stdin,
    /// Write a snapshot of the VM to the descriptor (a pipe's write end)
    /// and close it: the VM goes on (or stays paused). With `incremental`,
    /// only the pages written since its last snapshot. With `pause`, the
    /// VM is paused first and stays paused (a migration's stop-and-copy, in
    /// one round trip).
    Snapshot {
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        incremental: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        pause: bool,
    },
    /// Replace the VM's library `name` by the one in the descriptor (a
    /// sealed memfd of its file, checked by the daemon and again here)
    /// while the VM runs: a live update, waiting at most `wait_ms` for the
    /// guest to reach a point where it runs no library code. The reply's
    /// `updated` says what it did.
    UpdateLib { name: String, wait_ms: u64 },
    /// Try to open a file (proves the sandbox in tests).
    ProbeOpen { path: String },
    /// End the VMM process (its VM is killed first).
    Shutdown,
    /// A new family uplink (the descriptor passed with the request) in
    /// place of the one the VM was started with: a daemon that re-adopted
    /// the VM sends it (the old one's daemon end died with the previous
    /// daemon). Refused with [`NO_FORK`] by a VM that does not fork.
    Uplink,
}

/// The error a VM that does not fork answers an [`Request::Uplink`] with.
pub const NO_FORK: &str = "this VM does not fork: it has no uplink";

/// Addresses of a VM's NIC.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct NetSpec {
    /// IPv4 address.
    pub ip: [u8; 4],
    /// Prefix length.
    pub prefix: u8,
    /// Gateway.
    pub gateway: [u8; 4],
    /// MAC address.
    pub mac: [u8; 6],
    /// Rate limit of each direction (bytes/s, frames/s; 0 = unlimited).
    #[serde(default)]
    pub rate: (u64, u64),
    /// The offloads the daemon enabled on the tap it passes
    /// (`wisp_abi::net::offload` bits; none if absent).
    #[serde(default)]
    pub offloads: u64,
    /// Prefixes the VM routes for: IPv4 sources its frames may carry
    /// besides `ip` (`wisp_vmm::NetConfig::routes`; none if absent).
    #[serde(default)]
    pub routes: Vec<([u8; 4], u8)>,
}

/// A start's or host's NICs in device order: `net`, then `links` (which
/// need a first NIC).
pub fn nics(net: Option<NetSpec>, links: Vec<NetSpec>) -> Result<Vec<NetSpec>, &'static str> {
    if net.is_none() && !links.is_empty() {
        return Err("further NICs need a first one");
    }
    Ok(net.into_iter().chain(links).collect())
}

/// State of the VM in a VMM process.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    /// A prepared shell waiting for an image.
    Pooled,
    /// The guest runs.
    Running,
    /// The guest is paused.
    Paused,
    /// The guest has ended.
    Exited,
}

/// A reply.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Reply {
    /// Whether the request succeeded.
    pub ok: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// State after the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<WorkerState>,
    /// Exit, once the VM has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitInfo>,
    /// Microseconds of the execute phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_us: Option<u64>,
    /// A start's way through the VMM process on the host's monotonic
    /// clock (ns): the start received, the guest about to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entered_ns: Option<u64>,
    /// A start whose console goes to the client: the guest's first output
    /// written there (a second line after the start's reply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_output_ns: Option<u64>,
    /// A start: the shell held the image loaded ahead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preloaded: bool,
    /// A snapshot: bytes written, bytes of guest RAM in them, and
    /// microseconds the vCPU was held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved: Option<[u64; 3]>,
    /// A live update: µs in all, µs the guest was held, µs waited for it,
    /// variables carried over, pointers moved, pointers left stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<[u64; 6]>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Reply {
    /// Success with a state.
    pub fn ok(state: WorkerState) -> Reply {
        Reply { ok: true, state: Some(state), ..Default::default() }
    }
    /// Failure.
    pub fn err(msg: impl Into<String>) -> Reply {
        Reply { ok: false, error: Some(msg.into()), ..Default::default() }
    }
}

/// Most descriptors one message carries (a group's `host`: its VM's three
/// files and listener, the image, the client, the environment and files;
/// a start: the image, tap, uplink, client, environment and files, and up
/// to `wisp_api::MAX_VOLUMES` disks).
pub const MAX_FDS: usize = 10;

/// More descriptors than a message carries: an error for the sender
/// (they would be dropped on the way).
fn too_many(fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} descriptors, more than the {MAX_FDS} a message carries", fds.len())));
    }
    Ok(())
}

/// A poke on a pooled shell's session: one byte, outside any request
/// line, that says a start may come within a moment. The shell stays
/// awake (spins) a short while for it ([`take_pokes`]), so that the start
/// does not wait for its CPU to wake from idle (tens of µs on a
/// virtualised host): the daemon pokes as it begins a create, and the
/// wake-up overlaps the daemon's own work.
pub const POKE: u8 = 0;

/// Consume the pokes ([`POKE`] bytes) at the head of `sock` without
/// waiting; whether there were any. A request line never starts with one,
/// and a poke carries no descriptors, so it is read on its own.
pub fn take_pokes(sock: &UnixStream) -> bool {
    let mut head = [0u8; 16];
    let peek = RecvFlags::PEEK | RecvFlags::DONTWAIT;
    let n = match rustix::net::recv(sock, &mut head, peek) {
        Ok((n, _)) => head[..n].iter().take_while(|&&b| b == POKE).count(),
        Err(_) => 0,
    };
    n > 0 && rustix::net::recv(sock, &mut head[..n], RecvFlags::DONTWAIT).is_ok()
}

/// Poke pooled shell session `sock` (see [`POKE`]); never waits.
pub fn poke(sock: &UnixStream) {
    let _ = rustix::net::send(sock, &[POKE], SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
}

/// Sent by a forked VMM process on its family's uplink (a SEQPACKET socket
/// to the daemon), with one descriptor: its end of a fresh socket pair on
/// which the daemon answers with a [`ForkKit`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkNote {
    /// The new VMM process (the child VM).
    pub child_pid: u32,
    /// The VMM process of the VM that forked.
    pub parent_pid: u32,
}

/// The daemon's answer to a [`ForkNote`]: the child VM's id, and three
/// descriptors: its `exit.json`, `console.log` and its
/// listening control socket. Or an error.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkKit {
    pub id: Option<String>,
    pub error: Option<String>,
}

/// Send one message with descriptors on a SEQPACKET socket.
pub fn send_packet<T: Serialize>(sock: BorrowedFd<'_>, v: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    send_packet_flags(sock, v, fds, SendFlags::NOSIGNAL)
}

/// [`send_packet`] without waiting: a peer whose socket is full gets
/// nothing (`WouldBlock`), whatever the descriptor's own mode (which the
/// peer shares and may have set).
pub fn try_send_packet<T: Serialize>(sock: BorrowedFd<'_>, v: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    send_packet_flags(sock, v, fds, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)
}

fn send_packet_flags<T: Serialize>(sock: BorrowedFd<'_>, v: &T, fds: &[BorrowedFd<'_>], flags: SendFlags) -> io::Result<()> {
    let msg = serde_json::to_vec(v).map_err(io::Error::other)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    too_many(fds)?;
    if !fds.is_empty() {
        anc.push(SendAncillaryMessage::ScmRights(fds));
    }
    sendmsg(sock, &[io::IoSlice::new(&msg)], &mut anc, flags)?;
    Ok(())
}

/// One `recvmsg` into `buf`, adding the descriptors that came with it to
/// `fds` (more than [`MAX_FDS`] in all is an error; the kernel closes
/// those that did not fit one message); end of stream is an error.
fn recv_some(sock: BorrowedFd<'_>, buf: &mut [u8], fds: &mut Vec<OwnedFd>, flags: RecvFlags) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let r = recvmsg(sock, &mut [io::IoSliceMut::new(buf)], &mut anc, RecvFlags::CMSG_CLOEXEC | flags)?;
    for msg in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = msg {
            fds.extend(got);
        }
    }
    if fds.len() > MAX_FDS {
        fds.clear();
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("more than {MAX_FDS} descriptors")));
    }
    if r.bytes == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
    }
    Ok(r.bytes)
}

/// Largest packet read from a SEQPACKET socket (a longer one is cut).
const MAX_PACKET: usize = 4096;

/// Receive one message (and its descriptors) from a SEQPACKET socket.
pub fn recv_packet(sock: BorrowedFd<'_>) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    recv_packet_flags(sock, RecvFlags::empty())
}

/// [`recv_packet`] without waiting (`WouldBlock` if there is none).
pub fn try_recv_packet(sock: BorrowedFd<'_>) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    recv_packet_flags(sock, RecvFlags::DONTWAIT)
}

fn recv_packet_flags(sock: BorrowedFd<'_>, flags: RecvFlags) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; MAX_PACKET];
    let mut fds = Vec::new();
    let n = recv_some(sock, &mut buf, &mut fds, flags)?;
    buf.truncate(n);
    Ok((buf, fds))
}

/// Send one line (and optionally a descriptor) on `sock`.
pub fn send_line<T: Serialize>(sock: &UnixStream, v: &T, fd: Option<&OwnedFd>) -> io::Result<()> {
    send_line_fds(sock, v, fd.map(|f| f.as_fd()).as_slice())
}

/// Send one line with descriptors (at most [`MAX_FDS`]) on `sock`.
pub fn send_line_fds<T: Serialize>(sock: &UnixStream, v: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut line = serde_json::to_vec(v).map_err(io::Error::other)?;
    line.push(b'\n');
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    too_many(fds)?;
    if !fds.is_empty() {
        anc.push(SendAncillaryMessage::ScmRights(fds));
    }
    let n = sendmsg(sock, &[io::IoSlice::new(&line)], &mut anc, SendFlags::NOSIGNAL)?;
    if n < line.len() {
        (&*sock).write_all(&line[n..])?;
    }
    Ok(())
}

fn too_long(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{what} line too long (over {MAX_LINE} bytes)"))
}

/// Receive the request line (and the descriptors that came with it, at
/// most [`MAX_FDS`]) from `sock`; a line over [`MAX_LINE`] bytes is
/// refused. A connection carries exactly one request line, so whole reads
/// are safe: nothing after the newline belongs to anyone else.
pub fn recv_line(sock: &UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut line = Vec::new();
    let mut fds = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = recv_some(sock.as_fd(), &mut buf, &mut fds, RecvFlags::empty())?;
        let got = &buf[..n];
        let end = got.iter().position(|&b| b == b'\n');
        if line.len() + end.unwrap_or(n) > MAX_LINE {
            return Err(too_long("request"));
        }
        match end {
            Some(nl) => {
                line.extend_from_slice(&got[..nl]);
                return Ok((line, fds));
            }
            None => line.extend_from_slice(got),
        }
    }
}

/// A socket whose reads may time out (the control connection, or a
/// borrow of it).
pub trait Timed: Read {
    /// The read timeout.
    fn timeout(&self) -> io::Result<Option<Duration>>;
    /// Set the read timeout.
    fn set_timeout(&self, t: Option<Duration>) -> io::Result<()>;
}

impl Timed for UnixStream {
    fn timeout(&self) -> io::Result<Option<Duration>> {
        self.read_timeout()
    }
    fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)
    }
}

impl Timed for &UnixStream {
    fn timeout(&self) -> io::Result<Option<Duration>> {
        self.read_timeout()
    }
    fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)
    }
}

/// Read one line (without its newline) of at most [`MAX_LINE`] bytes from
/// `r`: a longer one is refused after [`MAX_LINE`] bytes of it, never
/// buffered whole. The socket's read timeout, if it has one, bounds the
/// whole line, not each read (a peer that trickles a byte now and then
/// does not hold the reader), and is set back afterwards. End of stream
/// before any byte is an error.
pub fn read_line_capped<S: Timed>(r: &mut BufReader<S>, what: &str) -> io::Result<Vec<u8>> {
    let orig = r.get_ref().timeout()?;
    let deadline = orig.map(|t| Instant::now() + t);
    let line = read_line_until(r, what, deadline);
    if orig.is_some() {
        r.get_ref().set_timeout(orig)?;
    }
    line
}

fn read_line_until<S: Timed>(r: &mut BufReader<S>, what: &str, deadline: Option<Instant>) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    loop {
        if let (Some(d), true) = (deadline, r.buffer().is_empty()) {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("no whole {what} line in time")));
            }
            r.get_ref().set_timeout(Some(left))?;
        }
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("no whole {what} line in time")))
            }
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            if line.is_empty() {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "VMM process closed the connection"));
            }
            return Ok(line);
        }
        let (take, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if line.len() + take > MAX_LINE {
            return Err(too_long(what));
        }
        line.extend_from_slice(&buf[..take]);
        r.consume(take + end as usize);
        if end {
            return Ok(line);
        }
    }
}

/// Read and decode one reply line from `r` ([`read_line_capped`]).
pub fn read_reply_line<S: Timed>(r: &mut BufReader<S>) -> io::Result<Reply> {
    let line = read_line_capped(r, "reply")?;
    serde_json::from_slice(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Client side: send `req` to the VMM process at `sock_path`, read the reply
/// line. Returns the reply and the connection (for `logs`, which streams
/// after the reply).
pub fn call(
    sock_path: &Path,
    req: &Request,
    fd: Option<&OwnedFd>,
    timeout: Option<Duration>,
) -> io::Result<(Reply, BufReader<UnixStream>)> {
    read_reply(send(sock_path, req, fd.map(|f| f.as_fd()).as_slice(), timeout)?)
}

/// First half of [`call`]: connect and send (work can overlap the reply).
pub fn send(sock_path: &Path, req: &Request, fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<UnixStream> {
    let sock = UnixStream::connect(sock_path)?;
    sock.set_read_timeout(timeout)?;
    send_line_fds(&sock, req, fds)?;
    Ok(sock)
}

/// [`send`] on a connection already open (a pooled shell's session), whose
/// read timeout was set when it was opened.
pub fn send_on(sock: UnixStream, req: &Request, fds: &[BorrowedFd<'_>]) -> io::Result<UnixStream> {
    send_line_fds(&sock, req, fds)?;
    Ok(sock)
}

/// Second half of [`call`]: read the reply line (at most [`MAX_LINE`]
/// bytes, within the socket's read timeout as a whole).
pub fn read_reply(sock: UnixStream) -> io::Result<(Reply, BufReader<UnixStream>)> {
    let mut r = BufReader::new(sock);
    let reply = read_reply_line(&mut r)?;
    Ok((reply, r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;
    use std::os::unix::net::UnixStream;

    /// A peer that writes `n` bytes of `b'x'` and then `tail`, as fast as it
    /// can, until the reader hangs up; gives back how many bytes it got out.
    fn flood(n: usize, tail: &'static [u8]) -> (UnixStream, std::thread::JoinHandle<usize>) {
        let (a, b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let mut b = b;
            let chunk = vec![b'x'; 64 * 1024];
            let mut sent = 0;
            while sent < n {
                match b.write(&chunk[..chunk.len().min(n - sent)]) {
                    Ok(k) => sent += k,
                    Err(_) => return sent,
                }
            }
            let _ = b.write_all(tail);
            sent
        });
        (a, t)
    }

    #[test]
    fn an_oversized_reply_line_is_refused_without_reading_it_whole() {
        let (a, t) = flood(256 << 20, b"\n");
        let e = read_reply(a).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        assert!(e.to_string().contains("reply line too long"), "{e}");
        // The reader hung up long before the 256 MiB were out.
        assert!(t.join().unwrap() < 16 << 20);
    }

    #[test]
    fn a_reply_line_up_to_the_limit_is_read() {
        let base = serde_json::to_vec(&Reply::err("")).unwrap();
        let pad = "y".repeat(MAX_LINE - base.len());
        let line = serde_json::to_vec(&Reply::err(pad.clone())).unwrap();
        assert_eq!(line.len(), MAX_LINE);
        let (a, mut b) = UnixStream::pair().unwrap();
        b.write_all(&line).unwrap();
        b.write_all(b"\nafter").unwrap();
        let (reply, mut rest) = read_reply(a).unwrap();
        assert_eq!(reply.error.as_deref(), Some(pad.as_str()));
        drop(b);
        let mut after = String::new();
        rest.read_to_string(&mut after).unwrap();
        assert_eq!(after, "after", "bytes after the reply line stay for the stream");
        // One more byte is refused; an empty connection is an error too.
        let (a, mut b) = UnixStream::pair().unwrap();
        b.write_all(&[b'x'; MAX_LINE + 1]).unwrap();
        assert_eq!(read_reply(a).unwrap_err().kind(), ErrorKind::InvalidData);
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        assert_eq!(read_reply(a).unwrap_err().kind(), ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_trickling_reply_times_out_as_a_whole() {
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let t = std::time::Instant::now();
            let _ = tx.send((read_reply(a).map(drop), t.elapsed()));
        });
        // A byte every 50 ms: no single read ever waits 300 ms.
        let mut result = None;
        for _ in 0..200 {
            if b.write_all(b"x").is_err() {
                break;
            }
            if let Ok(r) = rx.recv_timeout(Duration::from_millis(50)) {
                result = Some(r);
                break;
            }
        }
        let (r, took) = result.expect("the reader was still reading after 10 s");
        assert_eq!(r.unwrap_err().kind(), ErrorKind::TimedOut);
        assert!(took < Duration::from_secs(2), "{took:?}");
        // The timeout is the socket's own again afterwards.
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_read_timeout(Some(Duration::from_secs(7))).unwrap();
        b.write_all(b"{\"ok\":true}\n").unwrap();
        let mut r = BufReader::new(&a);
        assert!(read_reply_line(&mut r).unwrap().ok);
        assert_eq!(a.read_timeout().unwrap(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn request_lines_and_their_descriptors_are_capped() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let chunk = vec![b'x'; 4096];
            while b.write_all(&chunk).is_ok() {}
        });
        let e = recv_line(&a).unwrap_err();
        assert!(e.to_string().contains("request line too long"), "{e}");
        drop(a);
        t.join().unwrap();
        // A normal request, with a descriptor.
        let (a, b) = UnixStream::pair().unwrap();
        let fd: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        send_line(&b, &Request::Status, Some(&fd)).unwrap();
        let (line, fds) = recv_line(&a).unwrap();
        assert_eq!(serde_json::from_slice::<Request>(&line).unwrap(), Request::Status);
        assert_eq!(fds.len(), 1);
        // More than MAX_FDS descriptors over several messages of one request.
        let (a, b) = UnixStream::pair().unwrap();
        let fds: Vec<OwnedFd> = (0..MAX_FDS).map(|_| std::fs::File::open("/dev/null").unwrap().into()).collect();
        let refs: Vec<&OwnedFd> = fds.iter().collect();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        for part in [&b"{\"op\":"[..], b"\"status\"}\n"] {
            let mut anc = SendAncillaryBuffer::new(&mut space);
            let borrowed: Vec<_> = refs.iter().map(|f| f.as_fd()).collect();
            anc.push(SendAncillaryMessage::ScmRights(&borrowed));
            sendmsg(&b, &[io::IoSlice::new(part)], &mut anc, SendFlags::NOSIGNAL).unwrap();
        }
        let e = recv_line(&a).unwrap_err();
        assert!(e.to_string().contains("descriptors"), "{e}");
    }

    #[test]
    fn uplink_packets_are_sent_and_read_without_waiting() {
        use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
        let (a, b) = socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
        assert_eq!(try_recv_packet(a.as_fd()).unwrap_err().kind(), ErrorKind::WouldBlock);
        // Fill b's queue from a: a blocking send would now wait forever.
        let big = vec![0u8; 16 << 10];
        while sendmsg(&a, &[io::IoSlice::new(&big)], &mut SendAncillaryBuffer::default(), SendFlags::DONTWAIT).is_ok() {}
        let t = std::time::Instant::now();
        let e = try_send_packet(a.as_fd(), &ForkKit { id: None, error: Some("x".into()) }, &[]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
        assert!(t.elapsed() < Duration::from_secs(1));
        let (msg, fds) = try_recv_packet(b.as_fd()).unwrap();
        // A packet longer than MAX_PACKET is cut.
        assert_eq!((msg.len(), fds.len()), (MAX_PACKET, 0));
    }
}
