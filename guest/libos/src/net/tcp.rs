//! TCP: listeners with a backlog, and connections.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::cell::Cell;
use core::future::Future;
use core::net::Ipv4Addr;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;

use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp::{self, RecvError, SendError, State};
use smoltcp::wire::{IpAddress, IpEndpoint};

use super::{wait, with, with_started, Error, Result, Stack};

/// Options for TCP sockets ([`TcpListener::bind_with`],
/// [`TcpStream::connect_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpOptions {
    /// A listener keeps up to this many sockets listening (so this many
    /// handshakes can be under way at once) and stops replenishing them
    /// while this many connections wait to be accepted. Default 16. A
    /// backlog over 16 starts with 16 listening sockets and doubles them
    /// whenever half are taken at once: a server is listening soon after
    /// it starts (each socket costs its buffers' first pages), a burst of
    /// up to 16 clients is taken at once (a SYN that finds no listening
    /// socket is refused), and a larger burst finds more the next time.
    pub backlog: usize,
    /// Sockets listening from the start, for a server whose clients come
    /// as a burst larger than 16 (a benchmark's 50 connections at once);
    /// at most the backlog. Default 16.
    pub listen_first: usize,
    /// Receive buffer per connection, in bytes (the largest window we
    /// advertise). Default 16 KiB.
    pub rx_buffer: usize,
    /// Send buffer per connection, in bytes. Default 16 KiB.
    pub tx_buffer: usize,
    /// Send small segments at once instead of coalescing them while data
    /// is unacknowledged (Nagle's algorithm off). Default false.
    pub nodelay: bool,
    /// How long [`TcpStream::connect_with`] waits for the handshake.
    /// Default 20 s.
    pub connect_timeout: Duration,
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            backlog: 16,
            listen_first: FIRST_DEPTH,
            rx_buffer: 16 << 10,
            tx_buffer: 16 << 10,
            nodelay: false,
            connect_timeout: Duration::from_secs(20),
        }
    }
}

/// How long a listening socket waits for the ACK of its SYN-ACK before it
/// gives up on that client and listens again.
const HANDSHAKE_TIMEOUT: smoltcp::time::Duration = smoltcp::time::Duration::from_secs(20);

/// The smallest buffer a socket is given when the heap runs short.
const MIN_BUFFER: usize = 4 << 10;

/// Heap left free when buffers are given to a new socket: what the program
/// itself needs beside its connections (a 32nd of the heap, at least
/// 256 KiB).
fn heap_reserve(used: usize, free: usize) -> usize {
    ((used + free) / 32).max(256 << 10)
}

/// A smoltcp socket with the buffers and settings of `opts`, or smaller
/// ones so that many connections fit: a new socket's buffers are at most
/// a share of the heap left above a reserve — that heap over 16 plus
/// twice the `live` sockets, a power of two, at least [`MIN_BUFFER`] —
/// and halved again (down to [`MIN_BUFFER`]) if they still do not fit. So
/// the first connections get what they asked for, a crowd gets smaller
/// windows (a 128 MiB VM holds some 3,000 connections), and the program
/// does not run out of memory. `None` when even the smallest do not fit.
fn new_socket(opts: &TcpOptions, live: usize) -> Option<tcp::Socket<'static>> {
    let (used, free) = crate::heap::usage();
    let reserve = heap_reserve(used, free);
    let share = free.saturating_sub(reserve) / (16 + 2 * live);
    let cap = if share >= MIN_BUFFER { 1 << share.ilog2() } else { MIN_BUFFER };
    // Bounded so a window scale can describe them.
    let fit = |want: usize| {
        let w = want.clamp(64, 1 << 30);
        if w <= MIN_BUFFER { w } else { w.min(cap) }
    };
    let (mut rx, mut tx) = (fit(opts.rx_buffer), fit(opts.tx_buffer));
    loop {
        if let Some(rb) = crate::heap::try_zeroed(rx, reserve) {
            if let Some(tb) = crate::heap::try_zeroed(tx, reserve) {
                let mut s = tcp::Socket::new(tcp::SocketBuffer::new(rb), tcp::SocketBuffer::new(tb));
                s.set_nagle_enabled(!opts.nodelay);
                s.set_tsval_generator(Some(tsval));
                return Some(s);
            }
        }
        if rx.max(tx) <= MIN_BUFFER {
            return None;
        }
        (rx, tx) = ((rx / 2).max(rx.min(MIN_BUFFER)), (tx / 2).max(tx.min(MIN_BUFFER)));
    }
}

/// TCP timestamps (RFC 7323), offered on every connection as Linux does:
/// a server that closed first keeps its side in TIME-WAIT, and accepts a
/// new SYN from the same address and port only if it carries a newer
/// timestamp (or, by chance, a higher sequence number). Without them a
/// client that connects often (a proxy to its backend) meets its own old
/// connections and waits a retransmission (a second) each time. The clock
/// is the wall clock in milliseconds, so that it also grows across VMs
/// that reuse an address — and never goes back within a VM (a VM moved
/// to a host whose clock is behind: peers drop segments whose timestamp
/// is older than the last they saw, PAWS).
fn tsval() -> u32 {
    use core::sync::atomic::{AtomicU64, Ordering};
    static LAST_MS: AtomicU64 = AtomicU64::new(0);
    let now = crate::time::wall_ns() / 1_000_000;
    let last = LAST_MS.fetch_max(now, Ordering::Relaxed);
    now.max(last) as u32
}

/// `(address, port)` of an endpoint.
fn v4(e: IpEndpoint) -> (Ipv4Addr, u16) {
    #[allow(unreachable_patterns)]
    let addr = match e.addr {
        IpAddress::Ipv4(a) => a,
        _ => Ipv4Addr::UNSPECIFIED,
    };
    (addr, e.port)
}

/// Sockets a new listener keeps listening by default (see
/// [`TcpOptions::backlog`]).
const FIRST_DEPTH: usize = 16;

/// A listener's state inside the stack.
pub(crate) struct Listener {
    pub(super) port: u16,
    opts: TcpOptions,
    /// Sockets it keeps listening now: from `listen_first` up to the
    /// backlog.
    depth: usize,
    /// Sockets listening, or in the middle of a handshake.
    listening: Vec<SocketHandle>,
    /// Established connections not accepted yet.
    ready: VecDeque<SocketHandle>,
    /// The task waiting in `accept`.
    pub(super) waker: Option<Waker>,
}

impl Stack {
    /// Move established connections to their listener's ready queue, put
    /// sockets whose handshake failed back to listening, top the listening
    /// sockets up to the backlog, and wake tasks waiting to accept.
    pub(super) fn service_listeners(&mut self) {
        let sockets = &mut self.sockets;
        for l in self.listeners.iter_mut().flatten() {
            let mut i = 0;
            let mut taken = 0;
            while i < l.listening.len() {
                let s = sockets.get_mut::<tcp::Socket>(l.listening[i]);
                match s.state() {
                    State::Listen => i += 1,
                    State::SynReceived => {
                        taken += 1;
                        i += 1;
                    }
                    State::Closed | State::TimeWait => {
                        // The handshake failed: listen again.
                        s.abort();
                        let _ = s.listen(l.port);
                        i += 1;
                    }
                    _ => {
                        // Established: from now on an idle connection is
                        // fine (the timeout would abort it).
                        s.set_timeout(None);
                        l.ready.push_back(l.listening.swap_remove(i));
                        taken += 1;
                    }
                }
            }
            if taken * 2 >= l.depth {
                l.depth = (l.depth * 2).min(l.opts.backlog.max(1));
            }
            while l.listening.len() < l.depth && l.ready.len() < l.opts.backlog {
                // No memory for another: the backlog is what it is until
                // connections close (a SYN meanwhile gets a reset).
                let Some(mut s) = new_socket(&l.opts, sockets.iter().count()) else { break };
                // A handshake that stalls (a client gone, a spoofed SYN)
                // must not hold a backlog slot forever.
                s.set_timeout(Some(HANDSHAKE_TIMEOUT));
                if s.listen(l.port).is_err() {
                    break;
                }
                l.listening.push(sockets.add(s));
            }
            if !l.ready.is_empty() {
                if let Some(w) = l.waker.take() {
                    w.wake();
                }
            }
        }
    }
}

/// Whether a retired socket is done and can be freed; aborts it once it
/// `expired`.
pub(super) fn finished(s: &mut tcp::Socket, expired: bool) -> bool {
    match s.state() {
        // The peer has our FIN and we have its: nothing more to send. (We
        // do not keep sockets for the 2·MSL of TIME-WAIT.)
        State::TimeWait => true,
        // Closed, and the reset of an aborted connection (if any) is sent.
        State::Closed => s.remote_endpoint().is_none() || expired,
        _ if expired => {
            s.abort();
            false
        }
        _ => false,
    }
}

/// A TCP server socket: [`TcpListener::accept`] returns its connections.
/// Dropping it refuses connections that were not accepted yet.
pub struct TcpListener {
    id: usize,
    port: u16,
}

impl TcpListener {
    /// Listen on `port` (0: an ephemeral port) of the NIC's address, with
    /// default [`TcpOptions`]. (Each listener keeps a backlog of sockets
    /// with their buffers ready: see [`TcpOptions`] for their sizes.)
    ///
    /// ```ignore
    /// // An echo server (the image's manifest needs `.nic(true)`).
    /// let l = wisp::net::TcpListener::bind(7)?;
    /// wisp::exec::block_on(async move {
    ///     l.serve(|conn| async move {
    ///         let mut buf = [0u8; 1024];
    ///         while let Ok(n @ 1..) = conn.read(&mut buf).await {
    ///             if conn.write_all(&buf[..n]).await.is_err() { break }
    ///         }
    ///     }).await
    /// });
    /// ```
    pub fn bind(port: u16) -> Result<TcpListener> {
        TcpListener::bind_with(port, TcpOptions::default())
    }

    /// Listen on `port` (0: an ephemeral port); accepted connections use
    /// `opts`.
    pub fn bind_with(port: u16, opts: TcpOptions) -> Result<TcpListener> {
        let opts = TcpOptions { backlog: opts.backlog.max(1), ..opts };
        with(|st| {
            let port = match port {
                0 => st.ephemeral_port(true)?,
                p if st.tcp_port_used(p) => return Err(Error::AddrInUse),
                p => p,
            };
            let l = Listener { port, opts, depth: opts.listen_first.clamp(1, opts.backlog.max(1)), listening: Vec::new(), ready: VecDeque::new(), waker: None };
            let id = match st.listeners.iter().position(Option::is_none) {
                Some(i) => {
                    st.listeners[i] = Some(l);
                    i
                }
                None => {
                    st.listeners.push(Some(l));
                    st.listeners.len() - 1
                }
            };
            st.service_listeners();
            Ok(TcpListener { id, port })
        })?
    }

    /// For a server app's `main`: listen on `port` with `opts`, or say why
    /// not (prefixed with `app`) and give the exit code to use (1).
    pub fn bind_app(app: &str, port: u16, opts: TcpOptions) -> core::result::Result<TcpListener, i32> {
        TcpListener::bind_with(port, opts).map_err(|e| {
            crate::eprintln!("{}: cannot listen on TCP port {}: {}", app, port, e);
            1
        })
    }

    /// For a server app's `main`: serve connections with `handler` (see
    /// [`TcpListener::serve`]) until accepting fails, say why (prefixed with
    /// `app`) and give the exit code to use (1).
    pub fn serve_app<F, Fut>(self, app: &'static str, handler: F) -> i32
    where
        F: FnMut(TcpStream) -> Fut + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        crate::exec::block_on(async move {
            let e = self.serve(handler).await;
            crate::eprintln!("{}: accept: {}", app, e);
            1
        })
    }

    /// The port it listens on.
    pub fn local_port(&self) -> u16 {
        self.port
    }

    /// Accept connections until accepting fails, running `handler`'s future
    /// for each on a task of its own; returns the error that ended it.
    pub async fn serve<F, Fut>(&self, mut handler: F) -> Error
    where
        F: FnMut(TcpStream) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        loop {
            match self.accept().await {
                Ok(conn) => crate::exec::spawn(handler(conn)),
                Err(e) => return e,
            }
        }
    }

    /// Wait for the next established connection.
    pub async fn accept(&self) -> Result<TcpStream> {
        let id = self.id;
        wait(|st, waker| {
            while let Some(h) = st.listeners[id].as_mut().and_then(|l| l.ready.pop_front()) {
                if matches!(st.sockets.get::<tcp::Socket>(h).state(), State::Closed | State::TimeWait) {
                    // Reset or closed before it was accepted.
                    st.retire(h, true);
                    continue;
                }
                return Poll::Ready(Ok(TcpStream { handle: h, eof: Cell::new(false) }));
            }
            if let Some(l) = st.listeners[id].as_mut() {
                l.waker = Some(waker.clone());
            }
            Poll::Pending
        })
        .await
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        with_started(|st| {
            if let Some(l) = st.listeners.get_mut(self.id).and_then(Option::take) {
                for h in l.listening.into_iter().chain(l.ready) {
                    st.sockets.get_mut::<tcp::Socket>(h).abort();
                    st.retire(h, true);
                }
            }
        })
    }
}

/// A TCP connection. Dropping it (or [`TcpStream::close`]) closes it
/// gracefully: the stack still sends what was written, then a FIN, in the
/// background.
pub struct TcpStream {
    handle: SocketHandle,
    /// `read` returned end-of-file (keep returning it).
    eof: Cell<bool>,
}

impl TcpStream {
    /// Connect to `ip:port` with default [`TcpOptions`].
    ///
    /// ```ignore
    /// let reply = wisp::exec::block_on(async {
    ///     let s = wisp::net::TcpStream::connect([10, 0, 0, 1].into(), 13).await?;
    ///     let mut buf = [0u8; 128];
    ///     let n = s.read(&mut buf).await?;
    ///     Ok::<_, wisp::net::Error>(alloc::string::String::from_utf8_lossy(&buf[..n]).into_owned())
    /// });
    /// ```
    pub async fn connect(ip: Ipv4Addr, port: u16) -> Result<TcpStream> {
        TcpStream::connect_with(ip, port, TcpOptions::default()).await
    }

    /// Connect to `ip:port` from an ephemeral port.
    pub async fn connect_with(ip: Ipv4Addr, port: u16, opts: TcpOptions) -> Result<TcpStream> {
        if port == 0 || ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
            return Err(Error::InvalidInput);
        }
        let handle = with(|st| {
            if !st.reachable(ip) {
                return Err(Error::Unreachable);
            }
            let local = st.ephemeral_port(true)?;
            let mut s = new_socket(&opts, st.sockets.iter().count()).ok_or(Error::NoMemory)?;
            s.connect(st.iface.context(), (IpAddress::Ipv4(ip), port), local).map_err(|_| Error::Unreachable)?;
            Ok(st.sockets.add(s))
        })??;
        // From here on, dropping `stream` (an error, or the future being
        // dropped) retires the socket.
        let stream = TcpStream { handle, eof: Cell::new(false) };
        let mut timeout = crate::exec::sleep(opts.connect_timeout);
        wait(|st, waker| {
            let s = st.sockets.get_mut::<tcp::Socket>(handle);
            match s.state() {
                State::SynSent | State::SynReceived => {
                    if Pin::new(&mut timeout).poll(&mut Context::from_waker(waker)).is_ready() {
                        s.abort();
                        return Poll::Ready(Err(Error::TimedOut));
                    }
                    s.register_send_waker(waker);
                    Poll::Pending
                }
                State::Closed | State::TimeWait | State::Listen => Poll::Ready(Err(Error::ConnectionRefused)),
                _ => Poll::Ready(Ok(())),
            }
        })
        .await?;
        Ok(stream)
    }

    /// Read into `buf`; waits until at least one byte is there. Returns the
    /// number of bytes read, 0 at end of stream (the peer closed its side)
    /// or if `buf` is empty.
    pub async fn read(&self, buf: &mut [u8]) -> Result<usize> {
        if buf.is_empty() || self.eof.get() {
            return Ok(0);
        }
        let h = self.handle;
        let n = wait(|st, waker| {
            let s = st.sockets.get_mut::<tcp::Socket>(h);
            match s.recv_slice(&mut buf[..]) {
                Ok(0) => {
                    s.register_recv_waker(waker);
                    Poll::Pending
                }
                Ok(n) => Poll::Ready(Ok(n)),
                Err(RecvError::Finished) => Poll::Ready(Ok(0)),
                Err(RecvError::InvalidState) => Poll::Ready(Err(Error::ConnectionReset)),
            }
        })
        .await?;
        if n == 0 {
            self.eof.set(true);
        }
        Ok(n)
    }

    /// Write some of `data`; waits until there is room in the send buffer.
    /// Returns how many bytes were queued.
    pub async fn write(&self, data: &[u8]) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let h = self.handle;
        wait(|st, waker| {
            let s = st.sockets.get_mut::<tcp::Socket>(h);
            match s.send_slice(data) {
                Ok(0) => {
                    s.register_send_waker(waker);
                    Poll::Pending
                }
                Ok(n) => Poll::Ready(Ok(n)),
                Err(SendError::InvalidState) => Poll::Ready(Err(match s.state() {
                    State::Closed => Error::ConnectionReset,
                    _ => Error::BrokenPipe,
                })),
            }
        })
        .await
    }

    /// Write all of `data` (queued for sending when this returns).
    pub async fn write_all(&self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let n = self.write(data).await?;
            data = &data[n..];
        }
        Ok(())
    }

    /// Wait until everything written has been acknowledged by the peer.
    pub async fn flush(&self) -> Result<()> {
        let h = self.handle;
        wait(|st, waker| {
            let s = st.sockets.get_mut::<tcp::Socket>(h);
            if s.send_queue() == 0 {
                Poll::Ready(Ok(()))
            } else if s.state() == State::Closed {
                Poll::Ready(Err(Error::ConnectionReset))
            } else {
                s.register_send_waker(waker);
                Poll::Pending
            }
        })
        .await
    }

    /// Close the sending side: the peer reads end-of-file after the data
    /// already written. Reading still works.
    pub fn shutdown(&self) {
        let h = self.handle;
        let _ = with(|st| st.sockets.get_mut::<tcp::Socket>(h).close());
    }

    /// Close the connection (the same as dropping it).
    pub fn close(self) {}

    /// Send segments at once instead of coalescing small writes (Nagle's
    /// algorithm off) if `nodelay`.
    pub fn set_nodelay(&self, nodelay: bool) {
        let h = self.handle;
        let _ = with(|st| st.sockets.get_mut::<tcp::Socket>(h).set_nagle_enabled(!nodelay));
    }

    /// The peer's address and port.
    pub fn peer_addr(&self) -> Option<(Ipv4Addr, u16)> {
        let h = self.handle;
        with(|st| st.sockets.get::<tcp::Socket>(h).remote_endpoint()).ok().flatten().map(v4)
    }

    /// Our address and port.
    pub fn local_addr(&self) -> Option<(Ipv4Addr, u16)> {
        let h = self.handle;
        with(|st| st.sockets.get::<tcp::Socket>(h).local_endpoint()).ok().flatten().map(v4)
    }
}

impl Drop for TcpStream {
    fn drop(&mut self) {
        let h = self.handle;
        with_started(|st| {
            st.sockets.get_mut::<tcp::Socket>(h).close();
            st.retire(h, true);
        })
    }
}
