//! Host network plumbing through rtnetlink, from inside the daemon — no
//! `ip`, no scripts (LightVM's xendevd lesson): create the bridge, give it
//! the gateway address, attach a tap to it, isolate its port from the
//! other isolated ports (`bridge link set dev TAP isolated on`) and bring
//! links up.
//!
//! A request waits for the kernel's acknowledgement at most
//! [`ACK_TIMEOUT`], whatever arrives meanwhile: the daemon never hangs on
//! its netlink socket.

use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use rustix::net::sockopt::{set_socket_timeout, Timeout};
use rustix::net::{recv, send, socket_with, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

/// How long a request waits for its acknowledgement.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);

const RTM_NEWLINK: u16 = 16;
const RTM_SETLINK: u16 = 19;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const IFLA_IFNAME: u16 = 3;
const IFLA_MASTER: u16 = 10;
const IFLA_PROTINFO: u16 = 12;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_NET_NS_FD: u16 = 28;
const RTA_DST: u16 = 1;
const RTA_GATEWAY: u16 = 5;
/// `rtmsg` constants: the main table, a route the administrator (here
/// the daemon) made, of global scope, unicast.
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_STATIC: u8 = 4;
const RTN_UNICAST: u8 = 1;
/// In `IFLA_PROTINFO` of a bridge port (`enum` in `linux/if_link.h`).
const IFLA_BRPORT_ISOLATED: u16 = 33;
const NLA_F_NESTED: u16 = 0x8000;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFF_UP: u32 = 1;
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const AF_BRIDGE: u8 = 7;

/// A route-netlink socket.
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
    /// How long a request waits for its acknowledgement.
    ack_timeout: Duration,
}

fn attr(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = 4 + data.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(data);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// `struct ifinfomsg` of family `AF_UNSPEC`.
fn ifinfo(index: i32, flags: u32, change: u32) -> Vec<u8> {
    ifinfo_of(AF_UNSPEC, index, flags, change)
}

/// `struct ifinfomsg`.
fn ifinfo_of(family: u8, index: i32, flags: u32, change: u32) -> Vec<u8> {
    let mut b = vec![family, 0, 0, 0];
    b.extend_from_slice(&index.to_ne_bytes());
    b.extend_from_slice(&flags.to_ne_bytes());
    b.extend_from_slice(&change.to_ne_bytes());
    b
}

/// Index of interface `name`, if it exists.
pub fn if_index(name: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex")).ok()?.trim().parse().ok()
}

impl Netlink {
    /// Open the socket.
    pub fn open() -> io::Result<Netlink> {
        let fd = socket_with(AddressFamily::NETLINK, SocketType::RAW, SocketFlags::CLOEXEC, None)?;
        Netlink::over(fd, ACK_TIMEOUT)
    }

    /// A netlink client on socket `fd` whose requests wait at most
    /// `ack_timeout` for their acknowledgement.
    fn over(fd: OwnedFd, ack_timeout: Duration) -> io::Result<Netlink> {
        // Each receive wakes up at least this often to look at the deadline.
        set_socket_timeout(&fd, Timeout::Recv, Some(ack_timeout.min(Duration::from_millis(500))))?;
        Ok(Netlink { fd, seq: 1, ack_timeout })
    }

    /// Send one request and wait for its acknowledgement (replies to other
    /// requests are skipped), [`ACK_TIMEOUT`] at most.
    fn request(&mut self, ty: u16, flags: u16, body: &[u8]) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        send(&self.fd, &message(ty, flags, self.seq, body), SendFlags::empty())?;
        let deadline = Instant::now() + self.ack_timeout;
        let mut buf = vec![0u8; 8192];
        loop {
            if Instant::now() >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer from netlink"));
            }
            let n = match recv(&self.fd, &mut buf, RecvFlags::empty()) {
                Ok((n, _)) => n,
                Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::INTR => continue,
                Err(e) => return Err(e.into()),
            };
            if let Some(r) = find_ack(&buf[..n], self.seq) {
                return r;
            }
        }
    }

    /// Create bridge `name` if it does not exist; bring it up.
    pub fn ensure_bridge(&mut self, name: &str) -> io::Result<u32> {
        if if_index(name).is_none() {
            match self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &new_bridge(name)) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(e),
            }
        }
        let index = if_index(name).ok_or_else(|| io::Error::other(format!("bridge {name} did not appear")))?;
        self.set_link(index, None)?;
        Ok(index)
    }

    /// Bring link `index` up, optionally enslaving it to bridge `master`.
    pub fn set_link(&mut self, index: u32, master: Option<u32>) -> io::Result<()> {
        self.request(RTM_NEWLINK, 0, &link_up(index, master))
    }

    /// Enslave link `index` to bridge `master`, leaving it up or down.
    pub fn enslave(&mut self, index: u32, master: u32) -> io::Result<()> {
        self.request(RTM_NEWLINK, 0, &enslave(index, master))
    }

    /// Set or clear the isolation flag of bridge port `index`: isolated
    /// ports exchange no frames with one another, only with the bridge's
    /// ports that are not isolated — the bridge device itself (the host
    /// side, the gateway) among them. The kernel's `br_setport`, reached by
    /// `RTM_SETLINK` in the `AF_BRIDGE` family (`rtnl_bridge_setlink` →
    /// `br_setlink`) with the flag nested in `IFLA_PROTINFO`, as
    /// `bridge link set dev PORT isolated on` sends it.
    pub fn set_port_isolated(&mut self, index: u32, isolated: bool) -> io::Result<()> {
        self.request(RTM_SETLINK, 0, &port_isolation(index, isolated))
    }

    /// Move link `index` into the network namespace `ns` (an open
    /// `/run/netns` file), named `name` there. (The kernel brings a moved
    /// link down: bring it up from inside, [`Netlink::set_up_by_name`].)
    pub fn move_to_netns(&mut self, index: u32, ns: std::os::fd::BorrowedFd<'_>, name: &str) -> io::Result<()> {
        self.request(RTM_NEWLINK, 0, &move_link(index, std::os::fd::AsRawFd::as_raw_fd(&ns) as u32, name))
    }

    /// Bring link `name` up, found by its name (a socket opened in another
    /// network namespace, where this daemon's indices mean nothing).
    pub fn set_up_by_name(&mut self, name: &str) -> io::Result<()> {
        let mut body = ifinfo(0, IFF_UP, IFF_UP);
        attr(&mut body, IFLA_IFNAME, &cstr(name));
        self.request(RTM_NEWLINK, 0, &body)
    }

    /// Add (or delete) the route to `dst/len` through gateway `via`. A
    /// route being added that is there already is an error (`EEXIST`);
    /// one being deleted that is gone is not.
    pub fn route(&mut self, add: bool, (dst, len): ([u8; 4], u8), via: [u8; 4]) -> io::Result<()> {
        let body = route_body((dst, len), via);
        if add {
            return self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, &body);
        }
        match self.request(RTM_DELROUTE, 0, &body) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            r => r,
        }
    }

    /// Add IPv4 address `addr/prefix` to link `index` (no error if present).
    pub fn add_address(&mut self, index: u32, addr: [u8; 4], prefix: u8) -> io::Result<()> {
        match self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, &new_address(index, addr, prefix)) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            r => r,
        }
    }
}

/// A request: `struct nlmsghdr` (asking for an acknowledgement), then `body`.
fn message(ty: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let len = 16 + body.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&ty.to_ne_bytes());
    msg.extend_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(body);
    msg
}

/// `name` with its terminating NUL, as IFLA_IFNAME carries it.
fn cstr(name: &str) -> Vec<u8> {
    let mut c = name.as_bytes().to_vec();
    c.push(0);
    c
}

/// RTM_NEWLINK's body moving link `index` into the namespace of
/// descriptor `ns_fd`, renamed `name` (the kernel's `do_setlink` renames
/// as it moves).
fn move_link(index: u32, ns_fd: u32, name: &str) -> Vec<u8> {
    let mut body = ifinfo(index as i32, 0, 0);
    attr(&mut body, IFLA_NET_NS_FD, &ns_fd.to_ne_bytes());
    attr(&mut body, IFLA_IFNAME, &cstr(name));
    body
}

/// RTM_NEWROUTE/RTM_DELROUTE's body: `struct rtmsg` for `dst/len` in the
/// main table, through gateway `via`.
fn route_body((dst, len): ([u8; 4], u8), via: [u8; 4]) -> Vec<u8> {
    // family, dst_len, src_len, tos, table, protocol, scope, type, flags.
    let mut body = vec![AF_INET, len, 0, 0, RT_TABLE_MAIN, RTPROT_STATIC, 0, RTN_UNICAST];
    body.extend_from_slice(&0u32.to_ne_bytes());
    attr(&mut body, RTA_DST, &dst);
    attr(&mut body, RTA_GATEWAY, &via);
    body
}

/// RTM_NEWLINK's body for a new bridge `name`.
fn new_bridge(name: &str) -> Vec<u8> {
    let mut body = ifinfo(0, 0, 0);
    attr(&mut body, IFLA_IFNAME, &cstr(name));
    let mut info = Vec::new();
    attr(&mut info, IFLA_INFO_KIND, b"bridge");
    attr(&mut body, IFLA_LINKINFO | NLA_F_NESTED, &info);
    body
}

/// RTM_NEWLINK's body bringing link `index` up (under bridge `master`).
fn link_up(index: u32, master: Option<u32>) -> Vec<u8> {
    let mut body = ifinfo(index as i32, IFF_UP, IFF_UP);
    if let Some(m) = master {
        attr(&mut body, IFLA_MASTER, &m.to_ne_bytes());
    }
    body
}

/// RTM_NEWLINK's body enslaving link `index` to bridge `master` (its
/// flags untouched).
fn enslave(index: u32, master: u32) -> Vec<u8> {
    let mut body = ifinfo(index as i32, 0, 0);
    attr(&mut body, IFLA_MASTER, &master.to_ne_bytes());
    body
}

/// RTM_SETLINK's body (family `AF_BRIDGE`) setting bridge port `index`'s
/// isolation flag: `IFLA_PROTINFO` (nested) holding `IFLA_BRPORT_ISOLATED`
/// (u8).
fn port_isolation(index: u32, isolated: bool) -> Vec<u8> {
    let mut body = ifinfo_of(AF_BRIDGE, index as i32, 0, 0);
    let mut info = Vec::new();
    attr(&mut info, IFLA_BRPORT_ISOLATED, &[isolated as u8]);
    attr(&mut body, IFLA_PROTINFO | NLA_F_NESTED, &info);
    body
}

/// RTM_NEWADDR's body: `struct ifaddrmsg` and the address.
fn new_address(index: u32, addr: [u8; 4], prefix: u8) -> Vec<u8> {
    let mut body = vec![AF_INET, prefix, 0, 0];
    body.extend_from_slice(&index.to_ne_bytes());
    attr(&mut body, IFA_LOCAL, &addr);
    attr(&mut body, IFA_ADDRESS, &addr);
    body
}

/// The outcome of request `seq`, if datagram `buf` carries its
/// acknowledgement (NLMSG_ERROR: 0 or a negative errno).
fn find_ack(buf: &[u8], seq: u32) -> Option<io::Result<()>> {
    let mut at = 0;
    while at + 16 <= buf.len() {
        let mlen = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap_or_default()) as usize;
        let mty = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
        let mseq = u32::from_ne_bytes(buf[at + 8..at + 12].try_into().unwrap_or_default());
        if mlen < 16 || mlen > buf.len() - at {
            return Some(Err(io::Error::new(io::ErrorKind::InvalidData, "malformed netlink reply")));
        }
        if mty == NLMSG_ERROR && mseq == seq && mlen >= 20 {
            let err = i32::from_ne_bytes(buf[at + 16..at + 20].try_into().unwrap_or_default());
            return Some(if err == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(err.saturating_neg())) });
        }
        at += (mlen + 3) & !3;
    }
    None
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;

    use rustix::net::socketpair;

    use super::*;

    fn u16s(v: u16) -> [u8; 2] {
        v.to_ne_bytes()
    }

    fn u32s(v: u32) -> [u8; 4] {
        v.to_ne_bytes()
    }

    /// A reply: `struct nlmsghdr` of type `ty` for `seq`, then `body`.
    fn reply(ty: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut m = [&u32s(16 + body.len() as u32)[..], &u16s(ty), &u16s(0), &u32s(seq), &u32s(0), body].concat();
        m.resize(m.len().next_multiple_of(4), 0);
        m
    }

    /// An acknowledgement (NLMSG_ERROR) with `err` for request `seq`
    /// (followed, as the kernel does, by the request's header).
    fn ack(seq: u32, err: i32) -> Vec<u8> {
        reply(NLMSG_ERROR, seq, &[&err.to_ne_bytes()[..], &[0; 16]].concat())
    }

    #[test]
    fn requests_are_encoded_as_the_kernel_reads_them() {
        let m = message(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, 7, &[1, 2, 3, 4]);
        let want: Vec<u8> = [&u32s(20)[..], &u16s(20), &u16s(0x605), &u32s(7), &u32s(0), &[1, 2, 3, 4]].concat();
        assert_eq!(m, want);

        // ifinfomsg, IFLA_IFNAME "wisp0\0" padded to 4, nested IFLA_LINKINFO
        // holding IFLA_INFO_KIND "bridge".
        let b = new_bridge("wisp0");
        let want: Vec<u8> = [
            &[0u8; 16][..],
            &u16s(10),
            &u16s(IFLA_IFNAME),
            b"wisp0\0\0\0",
            &u16s(16),
            &u16s(IFLA_LINKINFO | 0x8000),
            &u16s(10),
            &u16s(IFLA_INFO_KIND),
            b"bridge\0\0",
        ]
        .concat();
        assert_eq!(b, want);
        assert_eq!(b.len() % 4, 0);

        let up = link_up(5, Some(2));
        let want: Vec<u8> =
            [&[0u8, 0, 0, 0][..], &5i32.to_ne_bytes(), &u32s(1), &u32s(1), &u16s(8), &u16s(IFLA_MASTER), &u32s(2)].concat();
        assert_eq!(up, want);
        assert_eq!(link_up(5, None), want[..16]);

        // Enslaved with flags untouched (neither up nor down).
        let e = enslave(5, 2);
        assert_eq!(e, [&[0u8, 0, 0, 0][..], &5i32.to_ne_bytes(), &u32s(0), &u32s(0), &u16s(8), &u16s(IFLA_MASTER), &u32s(2)].concat());

        // `bridge link set dev <5> isolated on`: ifinfomsg of family
        // AF_BRIDGE (7), then IFLA_PROTINFO (12) | NLA_F_NESTED holding
        // IFLA_BRPORT_ISOLATED (33), one byte padded to 4.
        let iso = port_isolation(5, true);
        let want: Vec<u8> = [
            &[7u8, 0, 0, 0][..],
            &5i32.to_ne_bytes(),
            &u32s(0),
            &u32s(0),
            &u16s(12),
            &u16s(12 | 0x8000),
            &u16s(5),
            &u16s(33),
            &[1, 0, 0, 0],
        ]
        .concat();
        assert_eq!(iso, want);
        let mut off = want.clone();
        off[24] = 0;
        assert_eq!(port_isolation(5, false), off);
        assert_eq!(message(RTM_SETLINK, 0, 9, &iso)[4..8], [&u16s(19)[..], &u16s(0x5)].concat());

        let a = new_address(5, [10, 77, 6, 1], 24);
        let want: Vec<u8> =
            [&[AF_INET, 24, 0, 0][..], &u32s(5), &u16s(8), &u16s(IFA_LOCAL), &[10, 77, 6, 1], &u16s(8), &u16s(IFA_ADDRESS), &[10, 77, 6, 1]]
                .concat();
        assert_eq!(a, want);
    }

    #[test]
    fn acknowledgements_are_found_by_sequence_number() {
        assert!(matches!(find_ack(&ack(3, 0), 3), Some(Ok(()))));
        let e = find_ack(&ack(3, -libc::EEXIST), 3).unwrap().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        // Another request's, a notification, a short datagram: not ours.
        assert!(find_ack(&ack(2, 0), 3).is_none());
        assert!(find_ack(&reply(RTM_NEWLINK, 3, &[0; 16]), 3).is_none());
        assert!(find_ack(&[0; 15], 3).is_none());
        assert!(find_ack(&[], 3).is_none());
        // Several messages in one datagram, with padding between them.
        let many = [reply(RTM_NEWLINK, 0, &[9; 5]), ack(2, -1), ack(3, -libc::EPERM)].concat();
        assert_eq!(find_ack(&many, 3).unwrap().unwrap_err().raw_os_error(), Some(libc::EPERM));
        // Lengths that do not fit: an error, never a panic or a loop.
        for bad in [0u32, 15, 1 << 20, u32::MAX] {
            let mut m = ack(3, 0);
            m[..4].copy_from_slice(&u32s(bad));
            let r = find_ack(&m, 3).expect("a malformed reply is an answer");
            assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidData, "length {bad}");
        }
        // An error code no errno has.
        assert!(find_ack(&ack(3, i32::MIN), 3).unwrap().is_err());
    }

    /// A client over one end of a datagram socket pair (the other end plays
    /// the kernel) whose requests wait `timeout`.
    fn pair(timeout: Duration) -> (Netlink, OwnedFd) {
        let (a, b) = socketpair(AddressFamily::UNIX, SocketType::DGRAM, SocketFlags::CLOEXEC, None).unwrap();
        (Netlink::over(a, timeout).unwrap(), b)
    }

    /// Run `f` on another thread; fail if it has not returned in 10 s.
    fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10)).expect("the request blocked for more than 10 s")
    }

    #[test]
    fn a_peer_that_never_answers_cannot_block_a_request() {
        let (mut nl, peer) = pair(Duration::from_millis(200));
        let t = Instant::now();
        let r = bounded(move || nl.set_link(4, None));
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(200), "gave up after {:?}", t.elapsed());
        // The request did go out.
        let mut buf = [0u8; 256];
        let (n, _) = recv(&peer, &mut buf, RecvFlags::DONTWAIT).unwrap();
        assert_eq!(&buf[..n], message(RTM_NEWLINK, 0, 2, &link_up(4, None)));
    }

    #[test]
    fn a_peer_that_only_chatters_cannot_block_a_request_either() {
        let (mut nl, peer) = pair(Duration::from_millis(300));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let chatter = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                // Replies to other requests, faster than the receive timeout.
                while !stop.load(Ordering::Relaxed) {
                    let _ = send(&peer, &ack(9999, 0), SendFlags::DONTWAIT);
                    std::thread::yield_now();
                }
            })
        };
        let r = bounded(move || nl.set_link(4, None));
        stop.store(true, Ordering::Relaxed);
        chatter.join().unwrap();
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn a_request_gets_its_own_acknowledgement() {
        let (mut nl, peer) = pair(Duration::from_secs(5));
        let kernel = std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            for err in [0, -libc::EEXIST, -libc::EPERM] {
                let (n, _) = recv(&peer, &mut buf, RecvFlags::empty()).unwrap();
                let seq = u32::from_ne_bytes(buf[8..12].try_into().unwrap());
                assert_eq!(n, u32::from_ne_bytes(buf[..4].try_into().unwrap()) as usize);
                // Someone else's acknowledgement first, then ours.
                send(&peer, &ack(seq.wrapping_sub(1), -libc::EINVAL), SendFlags::empty()).unwrap();
                send(&peer, &[reply(RTM_NEWLINK, 0, &[0; 16]), ack(seq, err)].concat(), SendFlags::empty()).unwrap();
            }
        });
        let r = bounded(move || {
            let up = nl.set_link(3, Some(1));
            // EEXIST: the address is there already, which is what was asked.
            let addr = nl.add_address(3, [10, 0, 0, 1], 24);
            let denied = nl.set_link(3, None);
            (up, addr, denied)
        });
        kernel.join().unwrap();
        assert!(r.0.is_ok() && r.1.is_ok(), "{r:?}");
        assert_eq!(r.2.unwrap_err().raw_os_error(), Some(libc::EPERM));
    }
}
