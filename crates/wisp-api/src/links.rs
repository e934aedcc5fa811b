//! A VM's further links (`CreateVm::links`): their description in the
//! API and the checks a request's links get before the daemon makes them.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};
use wisp_abi::net::prefix_mask;

/// A VM's further link (`CreateVm::links`): a NIC whose host end is a
/// network device moved into network namespace `netns` (a name under
/// `/run/netns`, as `ip netns add` makes), named `ifname` there and up.
/// The VM has `address` on the link; the link's subnet is the client's,
/// and the host routes it through the VM (whose first NIC may send from
/// it). What the client's end of the link is given (its address, its
/// route through the VM) is the namespace owner's to set.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    pub netns: String,
    #[serde(default = "default_ifname")]
    pub ifname: String,
    /// `A.B.C.D/N` (N from 8 to 30).
    pub address: String,
}

fn default_ifname() -> String {
    "eth0".into()
}

/// Most links a VM may have besides its first NIC.
pub const MAX_LINKS: usize = 4;

impl LinkSpec {
    /// The VM's address and the link's prefix length, if `address` is a
    /// host address of a /8 to /30 subnet.
    pub fn parsed(&self) -> Option<([u8; 4], u8)> {
        let (a, len) = self.address.split_once('/')?;
        let ip: Ipv4Addr = a.parse().ok()?;
        let len: u8 = len.parse().ok().filter(|l| (8..=30).contains(l))?;
        let hosts = !prefix_mask(len);
        let host = u32::from(ip) & hosts;
        (host != 0 && host != hosts).then_some((ip.octets(), len))
    }

    /// The link's subnet (network address, prefix length).
    pub fn subnet(&self) -> Option<([u8; 4], u8)> {
        let (ip, len) = self.parsed()?;
        Some(((u32::from_be_bytes(ip) & prefix_mask(len)).to_be_bytes(), len))
    }

    /// Why the link is not one to make, if it is not.
    pub fn invalid(&self) -> Option<String> {
        if !crate::valid_name(&self.netns, 64) {
            return Some(format!("link netns {:?}: a name under /run/netns (1-64 of [A-Za-z0-9_.-])", self.netns));
        }
        if !crate::valid_name(&self.ifname, 15) {
            return Some(format!("link ifname {:?}: an interface name (1-15 of [A-Za-z0-9_.-])", self.ifname));
        }
        if self.parsed().is_none() {
            return Some(format!("link address {:?}: a host address and its prefix, A.B.C.D/N with N from 8 to 30", self.address));
        }
        None
    }
}
