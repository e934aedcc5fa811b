//! Links: an app that processes packets itself (a firewall, a router —
//! ClickOS's kind of VM) takes the VM's NICs as links and moves whole
//! Ethernet frames, with no TCP/IP stack. Frames keep the virtio-net
//! header they came with (a super-frame of the host's stays one, its
//! checksum left to whoever segments it), so a frame can be passed from
//! one link to another as it is, or with its addresses rewritten.
//!
//! Taking the links turns the socket stack off for this VM: sockets fail
//! with [`Error::NoDevice`](super::Error::NoDevice) after, and links cannot
//! be taken once a socket started the stack.
//!
//! ```ignore
//! let mut links = wisp::net::link::take()?;
//! loop {
//!     let (a, b) = links.split_at_mut(1);
//!     let moved = a[0].recv(|frame, h| {
//!         let h = b[0].header_for(frame, h)?;
//!         b[0].send(frame.len(), h, |buf| buf.copy_from_slice(frame))
//!     });
//!     b[0].flush();
//!     if moved.is_none() { wisp::net::link::wait(&mut links, 1_000_000_000); }
//! }
//! ```

use alloc::vec::Vec;

use wisp_abi::bootinfo::MAX_DEVICES;
use wisp_abi::net::{gso, offload, vnet_flags, VnetHdr, MAX_FRAME, MAX_GSO_SEGS, MIN_GSO_SIZE, MTU};
use wisp_abi::DeviceKind;

use super::nic::{check, Nic};
use super::{usable, Error, Net, NetConfig, Result, NET};

/// One of the VM's NICs, taken as a link.
pub struct Link {
    nic: Nic,
    config: NetConfig,
}

/// A frame's virtio-net header as this library passes it on.
pub type Header = VnetHdr;

/// Take every usable NIC as a link, in device-table order (the order the
/// VM's NICs were given in). Fails with `NoDevice` if there is none, or
/// if the socket stack already runs.
pub fn take() -> Result<Vec<Link>> {
    NET.with(|n| {
        if let Net::Up(_) = n {
            return Err(Error::NoDevice);
        }
        *n = Net::Absent;
        let info = crate::env::boot_info();
        let count = (info.device_count as usize).min(MAX_DEVICES);
        let mut links = Vec::new();
        for (i, dev) in info.devices[..count].iter().enumerate() {
            if dev.kind != DeviceKind::Net as u32 {
                continue;
            }
            let config = super::decode_config(dev);
            if !usable(&config) {
                crate::println!("wisp: net: NIC {} ignored: unusable address configuration {:?}", i, config);
                continue;
            }
            match check(dev) {
                Ok((base, offloads)) => links.push(Link { nic: Nic::new(i as u32, base, offloads, dev.flags), config }),
                Err(why) => crate::println!("wisp: net: NIC {} ignored: {}", i, why),
            }
        }
        if links.is_empty() {
            Err(Error::NoDevice)
        } else {
            Ok(links)
        }
    })
}

impl Link {
    /// Its address configuration (from the device table).
    pub fn config(&self) -> NetConfig {
        self.config
    }

    /// Whether the monitor stopped it (it then neither sends nor receives).
    pub fn is_down(&mut self) -> bool {
        self.nic.is_dead()
    }

    /// Whether the TX ring has room for the longest frame.
    pub fn has_room(&self) -> bool {
        self.nic.tx_room()
    }

    /// Whether frames wait to be received.
    pub fn has_frames(&self) -> bool {
        self.nic.rx_waiting()
    }

    /// Give the next received frame and its header to `f`; `None` if none
    /// waits.
    pub fn recv<R>(&mut self, f: impl FnOnce(&[u8], Header) -> R) -> Option<R> {
        self.nic.recv_raw(f)
    }

    /// The header a frame received with `h` may leave this link with, or
    /// `None` if the monitor would refuse it so (and stop the NIC): the
    /// rules of `docs/abi.md` ("NIC"), which the host's header need not
    /// keep (a host's `hdr_len` counts its linear buffer, its `gso_size`
    /// may be a peer's small MSS making more than 64 segments, a frame may
    /// be longer than this link's MTU). No checksum validity claim goes on.
    pub fn header_for(&self, frame: &[u8], h: Header) -> Option<Header> {
        let offloads = self.nic.offloads();
        if h.flags & vnet_flags::NEEDS_CSUM == 0 {
            return (h.gso_type == gso::NONE && frame.len() <= MAX_FRAME as usize).then(VnetHdr::default);
        }
        if offloads & offload::CSUM == 0 || frame.len() < 34 || frame[12..14] != [0x08, 0x00] || frame[14] >> 4 != 4 {
            return None;
        }
        let ihl = (frame[14] & 0xf) as usize * 4;
        let frag = u16::from_be_bytes([frame[20], frame[21]]);
        let l4 = 14 + ihl;
        let (offset, l4_min) = match frame[23] {
            6 => (16, 20),
            17 => (6, 8),
            _ => return None,
        };
        if ihl < 20 || frag & 0x3fff != 0 || h.csum_start as usize != l4 || h.csum_offset != offset || l4 + l4_min > frame.len() {
            return None;
        }
        let mut out = VnetHdr { flags: vnet_flags::NEEDS_CSUM, csum_start: l4 as u16, csum_offset: offset, ..Default::default() };
        match h.gso_type {
            gso::NONE => (frame.len() <= MAX_FRAME as usize).then_some(out),
            gso::TCPV4 if offloads & offload::TSO4 != 0 && offset == 16 => {
                let hdrs = l4 + (frame[l4 + 12] >> 4) as usize * 4;
                let total = u16::from_be_bytes([frame[16], frame[17]]) as usize;
                let size = h.gso_size as usize;
                let payload = frame.len().checked_sub(hdrs)?;
                let fits = hdrs >= l4 + 20 && hdrs <= frame.len() && total == frame.len() - 14 && payload > 0;
                if !fits || size < MIN_GSO_SIZE as usize || size > MTU as usize - (hdrs - 14) || payload.div_ceil(size) > MAX_GSO_SEGS as usize {
                    return None;
                }
                if payload > size {
                    out.gso_type = gso::TCPV4;
                    out.hdr_len = hdrs as u16;
                    out.gso_size = h.gso_size;
                } else if frame.len() > MAX_FRAME as usize {
                    return None;
                }
                Some(out)
            }
            _ => None,
        }
    }

    /// Queue a `len`-byte frame built by `f`, with header `h` (see
    /// [`header_for`](Self::header_for)); `None` if the ring has no room.
    pub fn send<R>(&mut self, len: usize, h: Header, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        self.nic.send_raw(len, h, f)
    }

    /// Tell the monitor about frames queued (once per batch), and about
    /// RX slots freed.
    pub fn flush(&mut self) {
        self.nic.flush();
    }

    /// As [`flush`](Self::flush), for a caller that parks ([`wait`]) next
    /// unless more frames come: where the monitor sends queued frames at a
    /// park, a kick that would cost an exit is left to it (for 50 µs at
    /// most: a later flush pays it then).
    pub fn flush_before_wait(&mut self) {
        self.nic.flush_lazy();
    }
}

/// Park until frames arrive on any of `links` or `timeout_ns` passes
/// (whichever first); returns at once if frames wait already. Events the
/// park brings (a stop, family signals) are acted on as the executor does.
pub fn wait(links: &mut [Link], timeout_ns: u64) {
    if links.iter().any(Link::has_frames) {
        return;
    }
    for l in links.iter_mut() {
        l.nic.parking();
    }
    crate::process::dispatch_events(crate::hypercall::idle(timeout_ns));
}
