//! Host network plumbing through rtnetlink, from inside the daemon — no
//! `ip`, no scripts (LightVM's xendevd lesson): create the bridge, give it
//! the gateway address, attach a tap to it and bring links up.

use std::io;
use std::os::fd::OwnedFd;

use rustix::net::{recv, send, socket_with, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const IFLA_IFNAME: u16 = 3;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFF_UP: u32 = 1;
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;

/// A route-netlink socket.
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

fn attr(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = 4 + data.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(data);
    while buf.len() % 4 != 0 {
        buf.push(0);
    }
}

/// `struct ifinfomsg`.
fn ifinfo(index: i32, flags: u32, change: u32) -> Vec<u8> {
    let mut b = vec![AF_UNSPEC, 0, 0, 0];
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
        Ok(Netlink { fd, seq: 1 })
    }

    /// Send one request and wait for its acknowledgement.
    fn request(&mut self, ty: u16, flags: u16, body: &[u8]) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let len = 16 + body.len();
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_ne_bytes());
        msg.extend_from_slice(&ty.to_ne_bytes());
        msg.extend_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        msg.extend_from_slice(&self.seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(body);
        send(&self.fd, &msg, SendFlags::empty())?;
        let mut buf = vec![0u8; 8192];
        loop {
            let (n, _) = recv(&self.fd, &mut buf, RecvFlags::empty())?;
            let mut at = 0;
            while at + 16 <= n {
                let mlen = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap_or_default()) as usize;
                let mty = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
                let mseq = u32::from_ne_bytes(buf[at + 8..at + 12].try_into().unwrap_or_default());
                if mlen < 16 || at + mlen > n {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "malformed netlink reply"));
                }
                if mty == NLMSG_ERROR && mseq == self.seq && mlen >= 20 {
                    let err = i32::from_ne_bytes(buf[at + 16..at + 20].try_into().unwrap_or_default());
                    return if err == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(-err)) };
                }
                at += (mlen + 3) & !3;
            }
        }
    }

    /// Create bridge `name` if it does not exist; bring it up.
    pub fn ensure_bridge(&mut self, name: &str) -> io::Result<u32> {
        if if_index(name).is_none() {
            let mut body = ifinfo(0, 0, 0);
            let mut cname = name.as_bytes().to_vec();
            cname.push(0);
            attr(&mut body, IFLA_IFNAME, &cname);
            let mut info = Vec::new();
            attr(&mut info, IFLA_INFO_KIND, b"bridge");
            attr(&mut body, IFLA_LINKINFO | 0x8000 /* NLA_F_NESTED */, &info);
            match self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &body) {
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
        let mut body = ifinfo(index as i32, IFF_UP, IFF_UP);
        if let Some(m) = master {
            attr(&mut body, IFLA_MASTER, &m.to_ne_bytes());
        }
        self.request(RTM_NEWLINK, 0, &body)
    }

    /// Add IPv4 address `addr/prefix` to link `index` (no error if present).
    pub fn add_address(&mut self, index: u32, addr: [u8; 4], prefix: u8) -> io::Result<()> {
        let mut body = vec![AF_INET, prefix, 0, 0];
        body.extend_from_slice(&index.to_ne_bytes());
        attr(&mut body, IFA_LOCAL, &addr);
        attr(&mut body, IFA_ADDRESS, &addr);
        match self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, &body) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            r => r,
        }
    }
}
