//! The daemon ↔ VMM-process protocol: one request per connection on the
//! VMM process's control socket (`<state>/vms/<id>/ctl.sock`), a JSON line
//! each way, optionally a file descriptor (the image) passed with the
//! request, and for `logs` a raw byte stream after the reply line.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};
use wisp_api::ExitInfo;

/// Largest request line accepted.
const MAX_LINE: usize = 64 * 1024;

/// A request to a VMM process.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Load the image passed with the request and run it; with `attach`,
    /// stream the console after the reply (as `logs` with `follow`).
    Start {
        image_name: String,
        args: Vec<String>,
        timeout_ms: Option<u64>,
        #[serde(default)]
        attach: bool,
        /// A NIC on the tap passed as the second descriptor.
        #[serde(default)]
        net: Option<NetSpec>,
        /// The family's uplink to the daemon comes as the last descriptor:
        /// the guest may fork.
        #[serde(default)]
        uplink: bool,
    },
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
    /// Console output: the buffered bytes, then (if `follow`) new bytes until the VM ends.
    Logs { follow: bool },
    /// Reply when the VM has exited.
    Wait,
    /// Try to open a file (proves the sandbox in tests).
    ProbeOpen { path: String },
    /// End the VMM process (its VM is killed first).
    Shutdown,
}

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

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 4;

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

/// The daemon's answer to a [`ForkNote`]: the child VM's id, and four
/// descriptors: its directory, `exit.json.tmp`, `console.log.tmp` and its
/// listening control socket. Or an error.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkKit {
    pub id: Option<String>,
    pub error: Option<String>,
}

/// Send one message with descriptors on a SEQPACKET socket.
pub fn send_packet<T: Serialize>(sock: BorrowedFd<'_>, v: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let msg = serde_json::to_vec(v).map_err(io::Error::other)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    let fds = &fds[..fds.len().min(MAX_FDS)];
    if !fds.is_empty() {
        anc.push(SendAncillaryMessage::ScmRights(fds));
    }
    sendmsg(sock, &[io::IoSlice::new(&msg)], &mut anc, SendFlags::NOSIGNAL)?;
    Ok(())
}

/// One `recvmsg` into `buf`, adding the descriptors that came with it to
/// `fds`; end of stream is an error.
fn recv_some(sock: BorrowedFd<'_>, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let r = recvmsg(sock, &mut [io::IoSliceMut::new(buf)], &mut anc, RecvFlags::CMSG_CLOEXEC)?;
    for msg in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = msg {
            fds.extend(got);
        }
    }
    if r.bytes == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
    }
    Ok(r.bytes)
}

/// Receive one message (and its descriptors) from a SEQPACKET socket.
pub fn recv_packet(sock: BorrowedFd<'_>) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; 4096];
    let mut fds = Vec::new();
    let n = recv_some(sock, &mut buf, &mut fds)?;
    buf.truncate(n);
    Ok((buf, fds))
}

/// Send one line (and optionally a descriptor) on `sock`.
pub fn send_line<T: Serialize>(sock: &UnixStream, v: &T, fd: Option<&OwnedFd>) -> io::Result<()> {
    send_line_fds(sock, v, fd.as_slice())
}

/// Send one line with descriptors (at most [`MAX_FDS`]) on `sock`.
pub fn send_line_fds<T: Serialize>(sock: &UnixStream, v: &T, fds: &[&OwnedFd]) -> io::Result<()> {
    let mut line = serde_json::to_vec(v).map_err(io::Error::other)?;
    line.push(b'\n');
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    let borrowed: Vec<_> = fds.iter().take(MAX_FDS).map(|f| f.as_fd()).collect();
    if !borrowed.is_empty() {
        anc.push(SendAncillaryMessage::ScmRights(&borrowed));
    }
    let n = sendmsg(sock, &[io::IoSlice::new(&line)], &mut anc, SendFlags::NOSIGNAL)?;
    if n < line.len() {
        (&*sock).write_all(&line[n..])?;
    }
    Ok(())
}

/// Receive the request line (and a descriptor, if one came with it) from
/// `sock`. A connection carries exactly one request line, so whole reads
/// are safe: nothing after the newline belongs to anyone else.
pub fn recv_line(sock: &UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut line = Vec::new();
    let mut fds = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = recv_some(sock.as_fd(), &mut buf, &mut fds)?;
        let got = &buf[..n];
        if let Some(nl) = got.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&got[..nl]);
            return Ok((line, fds));
        }
        line.extend_from_slice(got);
        if line.len() > MAX_LINE {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "request line too long"));
        }
    }
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
    read_reply(send(sock_path, req, fd.as_slice(), timeout)?)
}

/// First half of [`call`]: connect and send (work can overlap the reply).
pub fn send(sock_path: &Path, req: &Request, fds: &[&OwnedFd], timeout: Option<Duration>) -> io::Result<UnixStream> {
    let sock = UnixStream::connect(sock_path)?;
    sock.set_read_timeout(timeout)?;
    send_line_fds(&sock, req, fds)?;
    Ok(sock)
}

/// Second half of [`call`]: read the reply line.
pub fn read_reply(sock: UnixStream) -> io::Result<(Reply, BufReader<UnixStream>)> {
    let mut r = BufReader::new(sock);
    let mut line = String::new();
    r.by_ref().take(MAX_LINE as u64).read_line(&mut line)?;
    if line.is_empty() {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "VMM process closed the connection"));
    }
    let reply = serde_json::from_str(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok((reply, r))
}
