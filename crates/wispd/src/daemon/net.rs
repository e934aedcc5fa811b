//! The VM network: the bridge (set up on first use) and, per VM, an address
//! from the subnet, a MAC and a tap attached to the bridge — its port
//! isolated from the other isolated ports unless the VM may talk to its
//! peers (`CreateVm::net_peers`).
//!
//! Making a tap and putting it on the bridge is most of what a VM's NIC
//! costs a create (~0.5 ms: a new network device, a bridge port; renaming
//! one made earlier costs half of that). So once the bridge exists, each
//! shell the pool prepares (at idle priority) gets its tap too, under the
//! name its VM will have (`wt` + the shell's id) — on the bridge, isolated,
//! IPv6 off, down — and a create that wants a NIC only brings it up
//! (~90 µs). A shell taken by a VM without a NIC, or discarded, hands its
//! tap to a thread that closes it at idle priority (closing a network
//! device waits for the kernel's RCU grace period).

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::sync::{mpsc, Mutex};

use wisp_vmm_process::proto::NetSpec;

use crate::netlink::{if_index, Netlink};

/// The name of the tap of the VM (or pooled shell) `id`, in the daemon's
/// network namespace.
pub fn tap_name(id: &str) -> String {
    format!("wt{}", &id[..id.len().min(12)])
}

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
    /// The address asked for (a restored VM's own) is another VM's, or
    /// not in the subnet.
    #[error("address {0} is in use or outside the VM subnet (a restored VM keeps its address: stop the VM that has it)")]
    AddressTaken(std::net::Ipv4Addr),
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
    ahead: Ahead,
}

/// Taps made ahead for pooled shells, by the shell's id.
#[derive(Default)]
struct Ahead {
    /// The bridge's index, once it exists (nothing is made before).
    bridge: Mutex<Option<u32>>,
    /// The netlink socket of the threads that make taps ahead.
    nl: Mutex<Option<Netlink>>,
    made: Mutex<HashMap<String, Made>>,
    /// Where unused taps go to be closed.
    closer: Mutex<Option<mpsc::Sender<Made>>>,
}

#[derive(Default)]
struct State {
    nl: Option<Netlink>,
    bridge: u32,
    /// Host parts given out.
    used: HashSet<u32>,
}

/// A tap made ahead: on the bridge, its port isolated, down.
struct Made {
    index: u32,
    tap: wisp_vmm::tap::Tap,
}

impl VmNet {
    /// VMs on bridge `bridge_name`, addresses from `subnet`.
    pub fn new(bridge_name: &str, subnet: ([u8; 4], u8)) -> VmNet {
        VmNet { bridge_name: bridge_name.to_string(), subnet, state: Mutex::new(State::default()), ahead: Ahead::default() }
    }

    /// Set up the bridge (once) and give VM `id` an address, a MAC and a
    /// tap. The tap's bridge port is isolated unless `peers`; it comes up
    /// only once that is set, so no frame crosses it before.
    /// Address `want` if given (a restored VM keeps the address its guest
    /// has): refused if another VM has it; else the first free one.
    pub fn alloc_at(&self, id: &str, peers: bool, want: Option<[u8; 4]>) -> Result<(NetSpec, OwnedFd), NetError> {
        let (net, prefix) = self.subnet;
        let base = u32::from_be_bytes(net) & wisp_abi::net::prefix_mask(prefix);
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
            *self.ahead.bridge.lock().unwrap() = Some(bridge);
        }
        let host = match want {
            Some(ip) => {
                let h = u32::from_be_bytes(ip).wrapping_sub(base);
                if !(2..=hosts).contains(&h) || st.used.contains(&h) {
                    return Err(NetError::AddressTaken(ip.into()));
                }
                h
            }
            None => (2..=hosts).find(|h| !st.used.contains(h)).ok_or(NetError::SubnetFull)?,
        };
        let ip = (base + host).to_be_bytes();
        let tap_name = tap_name(id);
        let bridge = st.bridge;
        let nl = st.nl.as_mut().expect("opened above");
        let made = self.ahead.made.lock().unwrap().remove(id);
        let (tap, index, isolated) = match made {
            Some(m) => (m.tap, m.index, true),
            None => {
                // With a virtio-net header and offloads (checksum, TSO): set
                // here, on the tap the VMM process gets, which may not make
                // the ioctls.
                let tap = wisp_vmm::tap::open_tap(&tap_name).map_err(NetError::Tap)?;
                let index = if_index(&tap_name).ok_or_else(|| NetError::TapMissing(tap_name.clone()))?;
                nl.enslave(index, bridge).map_err(|source| NetError::Attach { tap: tap_name.clone(), source })?;
                (tap, index, false)
            }
        };
        // Set on a new tap either way: the flag is what the VM asked for,
        // whatever the kernel's default for a new port.
        if !isolated || peers {
            nl.set_port_isolated(index, !peers).map_err(|source| NetError::Isolate { tap: tap_name.clone(), source })?;
        }
        nl.set_link(index, None).map_err(|source| NetError::Up { tap: tap_name.clone(), source })?;
        let wisp_vmm::tap::Tap { fd: tap, offloads } = tap;
        st.used.insert(host);
        Ok((NetSpec { ip, prefix, gateway: (base + 1).to_be_bytes(), mac: wisp_vmm::mac_for_ipv4(ip), rate: (0, 0), offloads, routes: Vec::new() }, tap))
    }

    /// Make the tap of pooled shell `id` ahead (once the bridge exists):
    /// for the refill thread, at its idle priority. Best effort: a create
    /// without one makes its own.
    pub fn prepare(&self, id: &str) {
        let Some(bridge) = *self.ahead.bridge.lock().unwrap() else { return };
        let name = tap_name(id);
        let mut nl = self.ahead.nl.lock().unwrap();
        if nl.is_none() {
            *nl = Netlink::open().ok();
        }
        let Some(nl) = nl.as_mut() else { return };
        let made = wisp_vmm::tap::open_tap(&name).map_err(|e| e.to_string()).and_then(|tap| {
            let index = if_index(&name).ok_or_else(|| format!("tap {name} did not appear"))?;
            // A VM's port needs no IPv6 of the host's (and bringing it up
            // then costs no address configuration).
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");
            nl.enslave(index, bridge).map_err(|e| format!("attach {name}: {e}"))?;
            nl.set_port_isolated(index, true).map_err(|e| format!("isolate {name}: {e}"))?;
            Ok(Made { index, tap })
        });
        match made {
            Ok(m) => {
                self.ahead.made.lock().unwrap().insert(id.to_string(), m);
            }
            Err(e) => eprintln!("wispd: pool: a tap made ahead: {e}"),
        }
    }

    /// Shell `id` will not use the tap made for it (a VM without a NIC, a
    /// discarded shell, a VM gone): it is closed by a thread of its own.
    pub fn release(&self, id: &str) {
        let Some(m) = self.ahead.made.lock().unwrap().remove(id) else { return };
        let mut closer = self.ahead.closer.lock().unwrap();
        if closer.is_none() {
            let (tx, rx) = mpsc::channel::<Made>();
            let started = std::thread::Builder::new().name("wispd-taps".into()).spawn(move || {
                let _ = wisp_jail::priority::background();
                for m in rx {
                    drop(m);
                }
            });
            if started.is_ok() {
                *closer = Some(tx);
            }
        }
        if let Some(tx) = closer.as_ref() {
            // (If the thread is gone, the tap closes here.)
            let _ = tx.send(m);
        }
    }

    /// The host part of address `ip`, if it is one a VM can have: in the
    /// subnet, and neither its network, gateway nor broadcast address.
    fn host_part(&self, ip: &str) -> Option<u32> {
        let a: Ipv4Addr = ip.parse().ok()?;
        let (net, prefix) = self.subnet;
        let mask = wisp_abi::net::prefix_mask(prefix);
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
