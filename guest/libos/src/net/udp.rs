//! UDP sockets.

use alloc::vec;
use core::net::Ipv4Addr;
use core::task::Poll;

use smoltcp::iface::SocketHandle;
use smoltcp::socket::udp::{self, PacketBuffer, PacketMetadata, RecvError, SendError};
use smoltcp::wire::{IpAddress, IpEndpoint};
use wisp_abi::net::MTU;

use super::{wait, with, with_started, Error, Result};

/// Largest datagram payload that fits in one frame (no IP fragmentation).
pub const MAX_DATAGRAM: usize = MTU as usize - 20 - 8;
/// Datagrams the receive queue holds: more than the network stack takes
/// from the RX ring in one poll (`INGRESS_BATCH`), so that a burst for one
/// socket is not dropped before its task runs; four such bursts for
/// sockets that share the VM.
pub(crate) const RECV_PACKETS: usize = 256;
/// Payload bytes the receive queue holds (Linux's default receive buffer
/// is 208 KiB, charged with per-packet overhead).
const RECV_BYTES: usize = 128 << 10;
/// Datagrams and payload bytes the send queue holds.
const SEND_PACKETS: usize = 32;
const SEND_BYTES: usize = 32 << 10;

/// A UDP socket bound to a local port.
pub struct UdpSocket {
    handle: SocketHandle,
    port: u16,
}

impl UdpSocket {
    /// Bind to `port` (0: an ephemeral port) on the NIC's address.
    ///
    /// ```ignore
    /// let s = wisp::net::UdpSocket::bind(7)?;
    /// wisp::exec::block_on(async move {
    ///     let mut buf = [0u8; 1500];
    ///     while let Ok((n, ip, port)) = s.recv_from(&mut buf).await {
    ///         let _ = s.send_to(&buf[..n], ip, port).await; // echo it back
    ///     }
    /// });
    /// ```
    pub fn bind(port: u16) -> Result<UdpSocket> {
        with(|st| {
            let port = match port {
                0 => st.ephemeral_port(false)?,
                p if st.udp_port_used(p) => return Err(Error::AddrInUse),
                p => p,
            };
            let buffer = |packets, bytes| PacketBuffer::new(vec![PacketMetadata::EMPTY; packets], vec![0u8; bytes]);
            let mut s = udp::Socket::new(buffer(RECV_PACKETS, RECV_BYTES), buffer(SEND_PACKETS, SEND_BYTES));
            s.bind(port).map_err(|_| Error::InvalidInput)?;
            Ok(UdpSocket { handle: st.sockets.add(s), port })
        })?
    }

    /// The local port.
    pub fn local_port(&self) -> u16 {
        self.port
    }

    /// Send `data` as one datagram to `ip:port` (waits for room in the send
    /// queue). At most [`MAX_DATAGRAM`] bytes.
    pub async fn send_to(&self, data: &[u8], ip: Ipv4Addr, port: u16) -> Result<usize> {
        if data.len() > MAX_DATAGRAM || port == 0 || ip.is_unspecified() {
            return Err(Error::InvalidInput);
        }
        let h = self.handle;
        let to = IpEndpoint::new(IpAddress::Ipv4(ip), port);
        wait(|st, waker| {
            if !st.reachable(ip) {
                return Poll::Ready(Err(Error::Unreachable));
            }
            let s = st.sockets.get_mut::<udp::Socket>(h);
            match s.send_slice(data, to) {
                Ok(()) => Poll::Ready(Ok(data.len())),
                Err(SendError::BufferFull) => {
                    s.register_send_waker(waker);
                    Poll::Pending
                }
                Err(SendError::Unaddressable) => Poll::Ready(Err(Error::InvalidInput)),
            }
        })
        .await
    }

    /// Wait for a datagram; copy it into `buf` (the part that does not fit
    /// is discarded) and return (bytes copied, sender address, sender port).
    pub async fn recv_from(&self, buf: &mut [u8]) -> Result<(usize, Ipv4Addr, u16)> {
        let h = self.handle;
        wait(|st, waker| {
            let s = st.sockets.get_mut::<udp::Socket>(h);
            match s.recv() {
                Ok((data, meta)) => {
                    let n = data.len().min(buf.len());
                    buf[..n].copy_from_slice(&data[..n]);
                    #[allow(unreachable_patterns)]
                    let from = match meta.endpoint.addr {
                        IpAddress::Ipv4(a) => a,
                        _ => Ipv4Addr::UNSPECIFIED,
                    };
                    Poll::Ready(Ok((n, from, meta.endpoint.port)))
                }
                Err(RecvError::Exhausted) | Err(RecvError::Truncated) => {
                    s.register_recv_waker(waker);
                    Poll::Pending
                }
            }
        })
        .await
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        let h = self.handle;
        with_started(|st| st.retire(h, false))
    }
}
