//! The VM network: the bridge (set up on first use) and, per VM, an address
//! from the subnet, a MAC and a tap attached to the bridge — its port
//! isolated from the other isolated ports unless the VM may talk to its
//! peers (`CreateVm::net_peers`).

use std::collections::HashSet;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::sync::Mutex;

use wisp_vmm_process::proto::NetSpec;

use crate::netlink::{if_index, Netlink};

/// Why a VM could not get its NIC.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The netlink socket.
    #[error("netlink: {0}")]
    Netlink(io::Error),
    /// Creating or bringing up the bridge.
    #[error("bridge {bridge}: {source}")]
    Bridge { bridge: String, source: io::Error },
    /// Giving the bridge the gateway address.
    #[error("address on {bridge}: {source}")]
    Address { bridge: String, source: io::Error },
    /// Every address of the subnet is given out.
    #[error("the VM subnet is full")]
    SubnetFull,
    /// Creating the tap.
    #[error("{0}")]
    Tap(wisp_vmm::Error),
    /// The tap was created but has no interface index.
    #[error("tap {0} did not appear")]
    TapMissing(String),
    /// Attaching the tap to the bridge.
    #[error("attach {tap}: {source}")]
    Attach { tap: String, source: io::Error },
    /// Setting the isolation flag of the tap's bridge port.
    #[error("isolate {tap} on the bridge: {source}")]
    Isolate { tap: String, source: io::Error },
    /// Bringing the tap up.
    #[error("bring {tap} up: {source}")]
    Up { tap: String, source: io::Error },
}

/// Bridge and address allocation.
pub struct VmNet {
    bridge_name: String,
    /// Network address and prefix; the bridge takes host 1.
    subnet: ([u8; 4], u8),
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    nl: Option<Netlink>,
    bridge: u32,
    /// Host parts given out.
    used: HashSet<u32>,
}

impl VmNet {
    /// VMs on bridge `bridge_name`, addresses from `subnet`.
    pub fn new(bridge_name: &str, subnet: ([u8; 4], u8)) -> VmNet {
        VmNet { bridge_name: bridge_name.to_string(), subnet, state: Mutex::new(State::default()) }
    }

    /// Set up the bridge (once) and give VM `id` an address, a MAC and a
    /// tap. The tap's bridge port is isolated unless `peers`; it comes up
    /// only once that is set, so no frame crosses it before.
    pub fn alloc(&self, id: &str, peers: bool) -> Result<(NetSpec, OwnedFd), NetError> {
        let (net, prefix) = self.subnet;
        let base = u32::from_be_bytes(net) & (u32::MAX << (32 - prefix as u32));
        let hosts = (1u32 << (32 - prefix as u32)).saturating_sub(2);
        let bridge_err = |source| NetError::Bridge { bridge: self.bridge_name.clone(), source };
        let mut st = self.state.lock().unwrap();
        if st.nl.is_none() {
            let mut nl = Netlink::open().map_err(NetError::Netlink)?;
            let bridge = nl.ensure_bridge(&self.bridge_name).map_err(bridge_err)?;
            nl.add_address(bridge, (base + 1).to_be_bytes(), prefix)
                .map_err(|source| NetError::Address { bridge: self.bridge_name.clone(), source })?;
            st.bridge = bridge;
            st.nl = Some(nl);
        }
        let host = (2..=hosts).find(|h| !st.used.contains(h)).ok_or(NetError::SubnetFull)?;
        let ip = (base + host).to_be_bytes();
        let tap_name = format!("wt{}", &id[..id.len().min(12)]);
        // With a virtio-net header and offloads (checksum, TSO): set here,
        // on the tap the VMM process gets, which may not make the ioctls.
        let wisp_vmm::tap::Tap { fd: tap, offloads } = wisp_vmm::tap::open_tap(&tap_name).map_err(NetError::Tap)?;
        let index = if_index(&tap_name).ok_or_else(|| NetError::TapMissing(tap_name.clone()))?;
        let bridge = st.bridge;
        let nl = st.nl.as_mut().expect("opened above");
        nl.enslave(index, bridge).map_err(|source| NetError::Attach { tap: tap_name.clone(), source })?;
        // Set either way: the flag is what the VM asked for, whatever the
        // kernel's default for a new port.
        nl.set_port_isolated(index, !peers).map_err(|source| NetError::Isolate { tap: tap_name.clone(), source })?;
        nl.set_link(index, None).map_err(|source| NetError::Up { tap: tap_name.clone(), source })?;
        st.used.insert(host);
        Ok((NetSpec { ip, prefix, gateway: (base + 1).to_be_bytes(), mac: wisp_vmm::mac_for_ipv4(ip), rate: (0, 0), offloads }, tap))
    }

    /// The host part of address `ip`, if it is one a VM can have: in the
    /// subnet, and neither its network, gateway nor broadcast address.
    fn host_part(&self, ip: &str) -> Option<u32> {
        let a: Ipv4Addr = ip.parse().ok()?;
        let (net, prefix) = self.subnet;
        let mask = u32::MAX << (32 - prefix as u32);
        let hosts = (1u32 << (32 - prefix as u32)).saturating_sub(2);
        let host = u32::from(a) & !mask;
        (u32::from(a) & mask == u32::from_be_bytes(net) & mask && (2..=hosts).contains(&host)).then_some(host)
    }

    /// Give address `ip` back (nothing for a VM without one).
    pub fn free(&self, ip: Option<&str>) {
        if let Some(h) = ip.and_then(|i| self.host_part(i)) {
            self.state.lock().unwrap().used.remove(&h);
        }
    }

    /// Take address `ip` for a running VM re-adopted after a restart: it
    /// must be one a VM of the subnet can have, and not taken already.
    pub fn claim(&self, ip: &str) -> Result<(), String> {
        let (net, prefix) = self.subnet;
        let h = self.host_part(ip).ok_or_else(|| format!("{ip:?} is no VM address of {}/{prefix}", Ipv4Addr::from(net)))?;
        if !self.state.lock().unwrap().used.insert(h) {
            return Err(format!("{ip} is another VM's"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_free_host_addresses_of_the_subnet_are_claimed() {
        let n = VmNet::new("wisp-test0", ([10, 99, 0, 0], 24));
        n.claim("10.99.0.2").unwrap();
        assert!(n.claim("10.99.0.2").unwrap_err().contains("another VM's"));
        for bad in ["10.99.1.2", "192.0.2.7", "10.99.0.0", "10.99.0.1", "10.99.0.255", "10.99.0.02", "10.99.0", "", "::1"] {
            assert!(n.claim(bad).is_err(), "{bad}");
        }
        // Freeing an address outside the subnet frees nothing in it.
        n.free(Some("10.99.1.2"));
        assert!(n.claim("10.99.0.2").is_err());
        n.free(Some("10.99.0.2"));
        n.claim("10.99.0.2").unwrap();
        let wide = VmNet::new("wisp-test0", ([10, 98, 0, 0], 16));
        wide.claim("10.98.7.9").unwrap();
        assert!(wide.claim("10.97.7.9").is_err());
    }
}
