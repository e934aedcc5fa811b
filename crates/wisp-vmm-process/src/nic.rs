//! A VM's NIC device: from a tap opened here (`wisp run --tap`) or passed
//! by the daemon ([`NetSpec`]). The MAC rule is the monitor's
//! ([`wisp_vmm::mac_for_ipv4`]).

use std::os::fd::OwnedFd;

use wisp_vmm::{mac_for_ipv4, NetConfig, NetRate};

use crate::proto::NetSpec;

/// A NIC on tap device `tap` (opened here), with address `ip`/prefix,
/// gateway `gw` and MAC `mac` (default: [`mac_for_ipv4`]).
pub fn tap_nic(tap: &str, ip: ([u8; 4], u8), mac: Option<[u8; 6]>, gw: Option<[u8; 4]>, rate: NetRate) -> Result<NetConfig, String> {
    // Opening a name that is not there would make a new tap, connected to
    // nothing: a mistyped name would give a VM that never hears a frame.
    let dev = std::path::Path::new("/sys/class/net").join(tap);
    if tap.contains('/') || !dev.exists() {
        return Err(format!("no such tap device '{tap}' (make one with `ip tuntap add {tap} mode tap`, or let wispd give the VM a NIC: --net)"));
    }
    if !dev.join("tun_flags").exists() {
        return Err(format!("'{tap}' is a network device but not a tap"));
    }
    let t = wisp_vmm::tap::open_tap(tap).map_err(|e| format!("tap {tap}: {e}"))?;
    Ok(NetConfig {
        tap: t.fd,
        offloads: t.offloads,
        mac: mac.unwrap_or(mac_for_ipv4(ip.0)),
        ip,
        gateway: gw,
        rate,
        routes: Vec::new(),
    })
}

impl NetSpec {
    /// The NIC the daemon described, on the tap it passed.
    pub fn into_config(self, tap: OwnedFd) -> NetConfig {
        let r = wisp_vmm::Rate { bytes: self.rate.0, ops: self.rate.1 };
        NetConfig {
            tap,
            offloads: self.offloads,
            mac: self.mac,
            ip: (self.ip, self.prefix),
            // (A link's NIC has none: 0.0.0.0.)
            gateway: (self.gateway != [0; 4]).then_some(self.gateway),
            rate: NetRate { tx: r, rx: r },
            routes: self.routes,
        }
    }
}
