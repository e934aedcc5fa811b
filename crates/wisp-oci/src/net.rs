//! The VM on the engine's network: in the network namespace the engine
//! made (podman's, a Kubernetes pod's), the interface it set up (a veth
//! with the container's address, its MAC and a default route) is handed
//! to the VM. A tap `wisp0` is made beside it and tc joins the two: every
//! frame arriving on the interface is redirected to the tap's egress (to
//! the VM), every frame from the VM to the interface's egress (`ingress`
//! qdiscs, a match-all `u32` filter with a `mirred` redirect on each: Kata
//! Containers' "tcfilter" model). The VM takes the interface's address,
//! MAC and gateway, so nothing outside the namespace sees a difference;
//! the namespace's own stack sees no frame any more. The tap lives as long
//! as the VM's process holds it.
//!
//! Netlink through `netlink-packet-route` (messages) and `netlink-sys`
//! (the socket); wispd's own `netlink.rs` predates them and does less.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use netlink_packet_route::tc::{
    TcAction, TcActionAttribute, TcActionMirrorOption, TcActionOption, TcActionType, TcAttribute, TcFilterU32Option, TcHandle,
    TcMessage, TcMirror, TcMirrorActionType, TcOption, TcU32Key, TcU32Selector, TcU32SelectorFlags,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use wisp_vmm::NetConfig;

/// The tap's name in the namespace.
pub const TAP: &str = "wisp0";

/// The engine's interface, as the VM takes it over.
#[derive(Debug)]
struct Uplink {
    index: u32,
    name: String,
    ip: Ipv4Addr,
    prefix: u8,
    mac: [u8; 6],
    gateway: Option<Ipv4Addr>,
}

/// Plumb this namespace's interface to a new tap; the VM's NIC on it.
/// None if the namespace has no interface with an IPv4 address (a new,
/// empty one: the VM has no network, as the container would not).
pub fn plumb() -> Result<Option<NetConfig>, String> {
    let mut nl = Netlink::open().map_err(|e| format!("netlink: {e}"))?;
    let Some(up) = nl.uplink()? else { return Ok(None) };
    // One VM per namespace: a live `wisp0` is another VM's (it goes with
    // its VM's process).
    if nl.index_of(TAP).is_ok() {
        return Err(format!("this network namespace's interface {} is already another wisp VM's (one per namespace)", up.name));
    }
    let tap = wisp_vmm::tap::open_tap(TAP).map_err(|e| format!("tap {TAP}: {e}"))?;
    let name = up.name.as_str();
    let what = |step: &'static str| move |e: std::io::Error| format!("{step} ({name} and {TAP}): {e}");
    let tap_index = nl.index_of(TAP).map_err(what("tap"))?;
    nl.set_up(tap_index).map_err(what("tap up"))?;
    // An earlier VM's redirect on the interface (a container restarted in
    // its pod's namespace) goes first: its ingress qdisc, filters and all.
    nl.delete_ingress_qdisc(up.index).map_err(what("old ingress qdisc"))?;
    for (from, to) in [(up.index, tap_index), (tap_index, up.index)] {
        nl.ingress_qdisc(from).map_err(what("ingress qdisc"))?;
        nl.redirect(from, to).map_err(what("redirect"))?;
    }
    Ok(Some(NetConfig {
        tap: tap.fd,
        offloads: tap.offloads,
        mac: up.mac,
        ip: (up.ip.octets(), up.prefix),
        gateway: up.gateway.map(|g| g.octets()),
        rate: Default::default(),
        routes: Vec::new(),
    }))
}

struct Netlink {
    sock: Socket,
    seq: u32,
}

impl Netlink {
    fn open() -> std::io::Result<Netlink> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        // A kernel that does not answer must not hang the engine.
        let tv = libc::timeval { tv_sec: 5, tv_usec: 0 };
        // SAFETY: SO_RCVTIMEO reads a timeval, a live local of that size.
        let r = unsafe {
            libc::setsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv as *const _ as *const libc::c_void, size_of::<libc::timeval>() as u32)
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Netlink { sock, seq: 0 })
    }

    /// Send `msg`; the answers (a dump's messages, or none for an ack).
    fn request(&mut self, msg: RouteNetlinkMessage, flags: u16) -> std::io::Result<Vec<RouteNetlinkMessage>> {
        self.seq += 1;
        let mut header = NetlinkHeader::default();
        header.flags = flags | NLM_F_REQUEST;
        header.sequence_number = self.seq;
        let mut m = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        m.finalize();
        let mut buf = vec![0u8; m.header.length as usize];
        m.serialize(&mut buf);
        self.sock.send(&buf, 0)?;
        let mut out = Vec::new();
        loop {
            let (data, _) = self.sock.recv_from_full()?;
            let mut off = 0;
            while off < data.len() {
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..]).map_err(std::io::Error::other)?;
                let len = m.header.length as usize;
                if len == 0 {
                    return Err(std::io::Error::other("netlink: an empty message"));
                }
                off += len;
                if m.header.sequence_number != self.seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            Some(code) => Err(std::io::Error::from_raw_os_error(-code.get())),
                            None => Ok(out),
                        }
                    }
                    NetlinkPayload::InnerMessage(i) => {
                        out.push(i);
                        if flags & (NLM_F_DUMP | NLM_F_ACK) == 0 {
                            return Ok(out);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// The first interface other than loopback with an IPv4 address.
    fn uplink(&mut self) -> Result<Option<Uplink>, String> {
        let mut am = AddressMessage::default();
        am.header.family = AddressFamily::Inet;
        let addrs = self.request(RouteNetlinkMessage::GetAddress(am), NLM_F_DUMP).map_err(|e| format!("addresses: {e}"))?;
        let found = addrs.iter().find_map(|m| match m {
            RouteNetlinkMessage::NewAddress(a) => a.attributes.iter().find_map(|at| match at {
                AddressAttribute::Address(IpAddr::V4(ip)) if !ip.is_loopback() => Some((a.header.index, *ip, a.header.prefix_len)),
                _ => None,
            }),
            _ => None,
        });
        let Some((index, ip, prefix)) = found else { return Ok(None) };
        let mut lm = LinkMessage::default();
        lm.header.index = index;
        let link = self.request(RouteNetlinkMessage::GetLink(lm), 0).map_err(|e| format!("interface {index}: {e}"))?;
        let (mut name, mut mac) = (String::new(), None);
        if let Some(RouteNetlinkMessage::NewLink(l)) = link.first() {
            for a in &l.attributes {
                match a {
                    LinkAttribute::IfName(n) => name = n.clone(),
                    LinkAttribute::Address(m) if m.len() == 6 => mac = Some([m[0], m[1], m[2], m[3], m[4], m[5]]),
                    _ => {}
                }
            }
        }
        let mac = mac.ok_or_else(|| format!("interface {name} ({index}) has no Ethernet address"))?;
        let mut rm = RouteMessage::default();
        rm.header.address_family = AddressFamily::Inet;
        let routes = self.request(RouteNetlinkMessage::GetRoute(rm), NLM_F_DUMP).map_err(|e| format!("routes: {e}"))?;
        let gateway = routes.iter().find_map(|m| match m {
            RouteNetlinkMessage::NewRoute(r) if r.header.destination_prefix_length == 0 => r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Gateway(RouteAddress::Inet(g)) => Some(*g),
                _ => None,
            }),
            _ => None,
        });
        Ok(Some(Uplink { index, name, ip, prefix, mac, gateway }))
    }

    fn index_of(&mut self, name: &str) -> std::io::Result<u32> {
        let mut lm = LinkMessage::default();
        lm.attributes.push(LinkAttribute::IfName(name.into()));
        match self.request(RouteNetlinkMessage::GetLink(lm), 0)?.first() {
            Some(RouteNetlinkMessage::NewLink(l)) => Ok(l.header.index),
            _ => Err(std::io::Error::other(format!("no interface {name}"))),
        }
    }

    fn set_up(&mut self, index: u32) -> std::io::Result<()> {
        let mut lm = LinkMessage::default();
        lm.header.index = index;
        lm.header.flags = LinkFlags::Up;
        lm.header.change_mask = LinkFlags::Up;
        self.request(RouteNetlinkMessage::SetLink(lm), NLM_F_ACK).map(drop)
    }

    /// `tc qdisc add dev INDEX ingress`
    fn ingress_qdisc(&mut self, index: u32) -> std::io::Result<()> {
        let mut tm = TcMessage::with_index(index as i32);
        tm.header.handle = TcHandle { major: 0xffff, minor: 0 };
        tm.header.parent = TcHandle::INGRESS;
        tm.attributes.push(TcAttribute::Kind("ingress".into()));
        self.request(RouteNetlinkMessage::NewQueueDiscipline(tm), NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL).map(drop)
    }

    /// `tc qdisc del dev INDEX ingress`, if there is one.
    fn delete_ingress_qdisc(&mut self, index: u32) -> std::io::Result<()> {
        let mut tm = TcMessage::with_index(index as i32);
        tm.header.handle = TcHandle { major: 0xffff, minor: 0 };
        tm.header.parent = TcHandle::INGRESS;
        match self.request(RouteNetlinkMessage::DelQueueDiscipline(tm), NLM_F_ACK) {
            // None there: ENOENT, or EINVAL from kernels that say so.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EINVAL)) => Ok(()),
            r => r.map(drop),
        }
    }

    /// `tc filter add dev FROM parent ffff: protocol all prio 1 u32 match
    /// u32 0 0 action mirred egress redirect dev TO` (u32 rather than
    /// `matchall`, which kernels may lack: this host's does)
    fn redirect(&mut self, from: u32, to: u32) -> std::io::Result<()> {
        let mut mirror = TcMirror::default();
        mirror.generic.action = TcActionType::Stolen;
        mirror.eaction = TcMirrorActionType::EgressRedir;
        mirror.ifindex = to;
        let mut action = TcAction::default();
        action.attributes.push(TcActionAttribute::Kind("mirred".into()));
        action.attributes.push(TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(mirror))]));
        let mut tm = TcMessage::with_index(from as i32);
        tm.header.parent = TcHandle { major: 0xffff, minor: 0 };
        // Priority 1, every protocol (ETH_P_ALL, in network byte order).
        tm.header.info = (1 << 16) | u32::from((libc::ETH_P_ALL as u16).to_be());
        // One key that matches every frame (mask 0); terminal: the
        // action decides.
        let mut sel = TcU32Selector::default();
        sel.flags = TcU32SelectorFlags::Terminal;
        sel.nkeys = 1;
        sel.keys = vec![TcU32Key::default()];
        tm.attributes.push(TcAttribute::Kind("u32".into()));
        tm.attributes.push(TcAttribute::Options(vec![TcOption::U32(TcFilterU32Option::Selector(sel)), TcOption::U32(TcFilterU32Option::Action(vec![action]))]));
        self.request(RouteNetlinkMessage::NewTrafficFilter(tm), NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL).map(drop)
    }
}
