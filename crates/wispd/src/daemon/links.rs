//! A VM's further links (`CreateVm::links`, `wisp run --link`): for a VM
//! that routes for a client, as a personal firewall does. Each link is a
//! tap made here and moved into the client's network namespace, renamed
//! and brought up there; the VM gets a NIC on it with the link's address
//! and may send from any source on it (it delivers the world's traffic to
//! the client). Its first NIC may send from the link's subnet, and the
//! host routes that subnet through the VM's first address — so the
//! client's traffic has no way around the VM. A link's subnet is one
//! VM's only, and never the daemon's own; routes go with the VM.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;

use wisp_api::action::overlap;
use wisp_api::LinkSpec;
use wisp_vmm_process::proto::NetSpec;

use super::error::ActionError;
use crate::netlink::{if_index, Netlink};

/// The links' subnets and the address they are routed through, by VM.
#[derive(Default)]
pub(super) struct Links {
    routed: Mutex<HashMap<String, (Vec<([u8; 4], u8)>, [u8; 4])>>,
}

/// A VM's links, made: their NICs' descriptions and taps (in order), and
/// the subnets its first NIC routes for.
pub(super) struct Made {
    pub specs: Vec<NetSpec>,
    pub taps: Vec<OwnedFd>,
    pub subnets: Vec<([u8; 4], u8)>,
}

/// The MAC of a link's NIC: locally administered, apart from the first
/// NICs' (`mac_for_ipv4`'s 52:54:00) though the address's last bytes are.
fn link_mac(ip: [u8; 4]) -> [u8; 6] {
    [0x52, 0x54, 0x01, ip[1], ip[2], ip[3]]
}

fn err(why: String) -> ActionError {
    ActionError::Link(why)
}

impl Links {
    /// Make the links of VM `id`, whose first NIC has address `via` on the
    /// daemon's subnet `own`: each subnet is claimed (refused if the
    /// daemon's or another VM's), each tap moved into its namespace and
    /// up, the routes added. On failure, nothing is left.
    pub fn make(&self, id: &str, via: [u8; 4], (own, pool): (([u8; 4], u8), ([u8; 4], u8)), links: &[LinkSpec]) -> Result<Made, ActionError> {
        let subnets: Vec<_> = links.iter().map(|l| l.subnet().ok_or_else(|| err(format!("link address {:?} is not usable", l.address)))).collect::<Result<_, _>>()?;
        {
            let mut routed = self.routed.lock().unwrap();
            for s in &subnets {
                if s.1 < pool.1 || !overlap(*s, pool) {
                    return Err(err(format!("link subnet {}/{} is outside the daemon's link subnets {}/{} (wispd --link-subnets)", fmt(s.0), s.1, fmt(pool.0), pool.1)));
                }
                if overlap(*s, own) {
                    return Err(err(format!("link subnet {}/{} overlaps the daemon's VM subnet", fmt(s.0), s.1)));
                }
                if let Some((other, _)) = routed.iter().find(|(_, (r, _))| r.iter().any(|t| overlap(*s, *t))) {
                    return Err(ActionError::LinkTaken(format!("link subnet {}/{} overlaps a link of VM {other}", fmt(s.0), s.1)));
                }
            }
            // Claimed whole now: a create running meanwhile sees them.
            routed.insert(id.to_string(), (subnets.clone(), via));
        }
        let made = self.make_claimed(id, via, links, &subnets);
        if made.is_err() {
            self.remove(id);
        }
        made
    }

    fn make_claimed(&self, id: &str, via: [u8; 4], links: &[LinkSpec], subnets: &[([u8; 4], u8)]) -> Result<Made, ActionError> {
        let mut nl = Netlink::open().map_err(|e| err(format!("netlink: {e}")))?;
        let mut made = Made { specs: Vec::new(), taps: Vec::new(), subnets: subnets.to_vec() };
        for (k, l) in links.iter().enumerate() {
            let (ip, prefix) = l.parsed().ok_or_else(|| err(format!("link address {:?} is not usable", l.address)))?;
            let ns = std::fs::File::open(format!("/run/netns/{}", l.netns))
                .map_err(|e| err(format!("link {k}: network namespace {:?}: {e} (make it with `ip netns add {}`)", l.netns, l.netns)))?;
            let name = format!("wl{}{k}", &id[..id.len().min(12)]);
            let tap = wisp_vmm::tap::open_tap(&name).map_err(|e| err(format!("link {k}: tap {name}: {e}")))?;
            let index = if_index(&name).ok_or_else(|| err(format!("link {k}: tap {name} did not appear")))?;
            nl.move_to_netns(index, ns.as_fd(), &l.ifname).map_err(|e| match e.raw_os_error() {
                Some(libc::EEXIST) => err(format!("link {k}: namespace {:?} has an interface {:?} already", l.netns, l.ifname)),
                _ => err(format!("link {k}: move {name} into {:?}: {e}", l.netns)),
            })?;
            up_inside(&ns, &l.ifname).map_err(|e| err(format!("link {k}: bring {:?} up in {:?}: {e}", l.ifname, l.netns)))?;
            let wisp_vmm::tap::Tap { fd, offloads } = tap;
            // Everything reaches the client through its link.
            made.specs.push(NetSpec { ip, prefix, gateway: [0; 4], mac: link_mac(ip), rate: (0, 0), offloads, routes: vec![([0; 4], 0)] });
            made.taps.push(fd);
        }
        for s in subnets {
            nl.route(true, *s, via).map_err(|e| match e.raw_os_error() {
                Some(libc::EEXIST) => ActionError::LinkTaken(format!("the host has a route to {}/{} already", fmt(s.0), s.1)),
                _ => err(format!("route {}/{} via {}: {e}", fmt(s.0), s.1, fmt(via))),
            })?;
        }
        Ok(made)
    }

    /// VM `id` is gone: its routes go (its taps went with its process; a
    /// route never added is no error).
    pub fn remove(&self, id: &str) {
        let Some((subnets, via)) = self.routed.lock().unwrap().remove(id) else { return };
        if subnets.is_empty() {
            return;
        }
        match Netlink::open() {
            Ok(mut nl) => {
                for s in subnets {
                    if let Err(e) = nl.route(false, s, via) {
                        eprintln!("wispd: VM {id}: route {}/{} via {}: {e}", fmt(s.0), s.1, fmt(via));
                    }
                }
            }
            Err(e) => eprintln!("wispd: VM {id}: its links' routes stay: netlink: {e}"),
        }
    }

    /// A running VM re-adopted after a restart: its links' subnets are its
    /// again (their routes are still the host's).
    pub fn adopt(&self, id: &str, via: Option<&str>, links: &[LinkSpec]) {
        let Some(via) = via.and_then(|v| v.parse::<std::net::Ipv4Addr>().ok()) else { return };
        let subnets = links.iter().filter_map(|l| l.subnet()).collect();
        self.routed.lock().unwrap().insert(id.to_string(), (subnets, via.octets()));
    }
}

fn fmt(a: [u8; 4]) -> std::net::Ipv4Addr {
    a.into()
}

/// Bring `ifname` up in network namespace `ns`: from a thread that moves
/// into it (a netlink socket belongs to its maker's namespace, and
/// `/proc/sys/net` shows the opener's), the daemon's own threads staying
/// where they are. IPv6 is off on it first: the VM routes IPv4 only, and
/// the kernel would spend an address, neighbour discovery and router
/// solicitations on a link that carries none.
fn up_inside(ns: &std::fs::File, ifname: &str) -> std::io::Result<()> {
    std::thread::scope(|s| {
        s.spawn(|| {
            rustix::thread::move_into_link_name_space(ns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))?;
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6"), "1");
            Netlink::open()?.set_up_by_name(ifname)
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the thread failed")))
    })
}
