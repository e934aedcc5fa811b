//! The relay of one established connection: the client's TLS records in,
//! their plaintext to the backend; the backend's bytes sealed into records
//! for the client. Both directions move at once — a write that waits for
//! room never stops the other side from being read (a backend answering
//! while the client still uploads would deadlock a relay that waited) —
//! with at most [`PENDING_MAX`] bytes held for either side, after which
//! that side's source is not read until they went out. A connection with
//! no traffic either way for [`IDLE`] is closed.

use alloc::vec;
use alloc::vec::Vec;
use core::future::{pending, Future};
use core::sync::atomic::Ordering;
use core::time::Duration;

use wisp::exec::{race, sleep_until, Either};
use wisp::time::Instant;
use wisp::net::TcpStream;

use crate::session::Session;
use crate::{send, BYTES_IN, BYTES_OUT};

/// Most bytes held for one side before its source is no longer read.
const PENDING_MAX: usize = 64 << 10;
/// A connection quiet both ways for this long is closed.
const IDLE: Duration = Duration::from_secs(120);

/// `f`, or never if not `on`.
async fn when<F: Future>(on: bool, f: F) -> F::Output {
    if on {
        f.await
    } else {
        pending().await
    }
}

enum Event {
    ClientWrote(wisp::net::Result<usize>),
    BackendWrote(wisp::net::Result<usize>),
    ClientRead(wisp::net::Result<usize>),
    BackendRead(wisp::net::Result<usize>),
    Idle,
}

/// Move data both ways until the backend is done and its bytes reached
/// the client (then a close_notify and a FIN), or either side fails, or
/// the connection idles. `to_backend`: plaintext the handshake brought.
pub async fn relay(client: &TcpStream, upstream: &TcpStream, s: &mut Session, mut to_backend: Vec<u8>) -> Result<(), ()> {
    let mut cbuf = vec![0u8; 16 * 1024];
    let mut ubuf = vec![0u8; 16 * 1024];
    // Whether the client may still send (no close_notify yet), the backend
    // may still send (no EOF yet), and our FIN went to the backend.
    let (mut client_open, mut backend_open, mut backend_shut) = (!s.peer_closed(), true, false);
    // One timer a connection, not one an event (the executor keeps each
    // until its deadline): when it fires early of the idle time since the
    // last event, it is set again for the rest.
    let mut last = Instant::now();
    let mut idle = sleep_until(last.add(IDLE));
    loop {
        if !client_open && to_backend.is_empty() && !backend_shut {
            // The client's close_notify, its data delivered: the backend
            // sees our FIN and may still answer.
            upstream.shutdown();
            backend_shut = true;
        }
        if !backend_open && s.out.is_empty() {
            let _ = s.close();
            let _ = send(client, s).await;
            client.shutdown();
            return Ok(());
        }
        let event = {
            let writes = race(
                when(!s.out.is_empty(), client.write(&s.out)),
                when(!to_backend.is_empty(), upstream.write(&to_backend)),
            );
            let reads = race(
                when(client_open && to_backend.len() < PENDING_MAX, client.read(&mut cbuf)),
                when(backend_open && s.out.len() < PENDING_MAX, upstream.read(&mut ubuf)),
            );
            match race(writes, race(reads, &mut idle)).await {
                Either::Left(Either::Left(r)) => Event::ClientWrote(r),
                Either::Left(Either::Right(r)) => Event::BackendWrote(r),
                Either::Right(Either::Left(Either::Left(r))) => Event::ClientRead(r),
                Either::Right(Either::Left(Either::Right(r))) => Event::BackendRead(r),
                Either::Right(Either::Right(())) => Event::Idle,
            }
        };
        if !matches!(event, Event::Idle) {
            last = Instant::now();
        }
        match event {
            Event::Idle if last.elapsed() < IDLE => idle = sleep_until(last.add(IDLE)),
            Event::ClientWrote(Ok(n)) => {
                BYTES_OUT.fetch_add(n as u64, Ordering::Relaxed);
                s.out.drain(..n);
            }
            Event::BackendWrote(Ok(n)) => {
                to_backend.drain(..n);
            }
            Event::ClientWrote(Err(_)) | Event::BackendWrote(Err(_)) | Event::Idle => return Err(()),
            // The client left without a close_notify: nobody to answer.
            Event::ClientRead(Ok(0)) | Event::ClientRead(Err(_)) => return Err(()),
            Event::ClientRead(Ok(n)) => {
                BYTES_IN.fetch_add(n as u64, Ordering::Relaxed);
                if let Err(_) = s.feed(&cbuf[..n]).and_then(|_| s.advance(&mut to_backend)) {
                    // (The alert rustls queued, if any.)
                    let _ = send(client, s).await;
                    return Err(());
                }
                client_open = !s.peer_closed();
            }
            Event::BackendRead(Ok(0)) | Event::BackendRead(Err(_)) => backend_open = false,
            Event::BackendRead(Ok(n)) => s.seal(&ubuf[..n]).map_err(drop)?,
        }
    }
}
