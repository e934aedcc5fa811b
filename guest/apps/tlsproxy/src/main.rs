//! `tlsproxy BACKEND [PORT]`: TLS termination (LightVM §7.3). It listens on
//! TCP port PORT (default 443), ends TLS 1.3 with the certificate chain in
//! `/cert.pem` and the private key in `/key.pem` (files given with `wisp
//! run --file`: the key never leaves the VM, and wispd keeps no copy), and
//! relays each connection's plaintext to a TCP connection of its own to
//! BACKEND (`IP:PORT`), both ways, until either side closes.
//!
//! TLS is rustls (no_std, unbuffered API) with RustCrypto's provider:
//! X25519 and P-256 key exchange; Ed25519, ECDSA and RSA keys;
//! ChaCha20-Poly1305 (preferred) and AES-GCM. No session resumption (no
//! tickets, no cache): every connection is a full handshake.
//!
//! It says `tlsproxy: listening on IP:PORT for BACKEND` when it serves, and
//! on a stop prints its counters (`tlsproxy: counters ...`) and exits 0.
//! Connections beyond what its heap holds are refused (closed at once,
//! counted); a connection quiet both ways for 2 minutes is closed.
//! A missing or bad certificate or key: why, and exit status 2.
#![no_std]
#![no_main]

extern crate alloc;

mod entropy;
mod relay;
mod session;

use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::future::Future;
use core::net::Ipv4Addr;
use core::pin::pin;
use core::task::Poll;
use core::sync::atomic::{AtomicU64, Ordering};
use core::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ServerConfig;
use wisp::exec::timeout;
use wisp::net::{TcpListener, TcpOptions, TcpStream};

use session::Session;

wisp::main!(main, wisp::Manifest::new().nic(true));

/// A client has this long to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshake failures printed one by one; later ones are only counted.
const FAILURES_PRINTED: u64 = 20;
/// Heap a connection may take at most: its buffers (the handshake's 16 KiB,
/// the relay's two, up to 64 KiB held each way, TLS records in and out)
/// and its TLS state — the stack's socket buffers aside, which shrink as
/// the heap fills. Connections beyond what the heap holds at this rate
/// are refused at once rather than let one client's crowd exhaust it.
const PER_CONNECTION: usize = 320 << 10;
/// Heap kept beside the connections for everything else.
const RESERVE: usize = 1 << 20;

/// Connections served now, and the most served at once.
static LIVE: AtomicU64 = AtomicU64::new(0);
static MAX_LIVE: AtomicU64 = AtomicU64::new(0);

/// Counters, printed on stop.
static HANDSHAKES: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static BACKEND_FAILED: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);
pub(crate) static BYTES_IN: AtomicU64 = AtomicU64::new(0);
pub(crate) static BYTES_OUT: AtomicU64 = AtomicU64::new(0);

fn main() -> i32 {
    let backend = match wisp::env::arg(1).and_then(parse_addr) {
        Some(b) => b,
        None => {
            wisp::eprintln!("usage: tlsproxy BACKEND_IP:PORT [PORT] (with --file CERT:/cert.pem --file KEY:/key.pem)");
            return 2;
        }
    };
    let (port, cfg) = match wisp::net::server_args("tlsproxy", 2, 443) {
        Ok(x) => x,
        Err(code) => return code,
    };
    if !entropy::available() {
        wisp::eprintln!("tlsproxy: this CPU has no RDRAND: no source of random numbers for TLS");
        return 1;
    }
    let config = match server_config() {
        Ok(c) => c,
        Err(e) => {
            wisp::eprintln!("tlsproxy: {}", e);
            return 2;
        }
    };
    // Handshake records and answers go out at once.
    let opts = TcpOptions { nodelay: true, ..TcpOptions::default() };
    let listener = match TcpListener::bind_app("tlsproxy", port, opts) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let (used, free) = wisp::heap::usage();
    let most = ((used + free).saturating_sub(RESERVE) / PER_CONNECTION).max(4) as u64;
    MAX_LIVE.store(most, Ordering::Relaxed);
    wisp::process::on_stop(stop);
    wisp::println!("tlsproxy: listening on {}:{} for {}:{}", cfg.ip, port, backend.0, backend.1);
    listener.serve_app("tlsproxy", move |conn| serve(conn, config.clone(), backend))
}

/// `IP:PORT`.
fn parse_addr(s: &str) -> Option<(Ipv4Addr, u16)> {
    let (ip, port) = s.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    Some((ip.parse().ok()?, port))
}

/// The TLS configuration from `/cert.pem` and `/key.pem`, or why not.
fn server_config() -> Result<Arc<ServerConfig>, alloc::string::String> {
    use alloc::format;
    let read = |path: &str| wisp::fs::read(path).map_err(|e| format!("cannot read {}: {}", path, e));
    let certs = CertificateDer::pem_slice_iter(read("/cert.pem")?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("/cert.pem: not a PEM certificate chain: {:?}", e))?;
    if certs.is_empty() {
        return Err("/cert.pem: no certificate in it (want PEM `BEGIN CERTIFICATE` blocks)".into());
    }
    let key = PrivateKeyDer::from_pem_slice(read("/key.pem")?).map_err(|e| format!("/key.pem: not a PEM private key: {:?}", e))?;
    // ChaCha20-Poly1305 first, and the server's order over the client's:
    // this guest's crypto is portable code (no AES-NI or SHA-NI on the
    // guest target), where ChaCha20 and SHA-256 cost a fraction of
    // AES-GCM and SHA-384.
    let mut provider = rustls_rustcrypto::provider();
    provider.cipher_suites = vec![
        rustls_rustcrypto::TLS13_CHACHA20_POLY1305_SHA256,
        rustls_rustcrypto::TLS13_AES_128_GCM_SHA256,
        rustls_rustcrypto::TLS13_AES_256_GCM_SHA384,
    ];
    // X25519 and P-256: P-384 in this portable code costs milliseconds a
    // handshake, which any client could make the proxy pay.
    provider.kx_groups.retain(|g| matches!(g.name(), rustls::NamedGroup::X25519 | rustls::NamedGroup::secp256r1));
    let provider = Arc::new(provider);
    let mut config = ServerConfig::builder_with_details(provider, Arc::new(entropy::Clock))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS 1.3: {}", e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("the certificate and key: {}", e))?;
    // Every connection is a full handshake (nothing kept between them).
    config.send_tls13_tickets = 0;
    config.ignore_client_order = true;
    Ok(Arc::new(config))
}

/// Send what the session queued.
pub(crate) async fn send(conn: &TcpStream, s: &mut Session) -> Result<(), wisp::net::Error> {
    if !s.out.is_empty() {
        let r = conn.write_all(&s.out).await;
        BYTES_OUT.fetch_add(s.out.len() as u64, Ordering::Relaxed);
        s.out.clear();
        r?;
    }
    Ok(())
}

fn failed(peer: Option<(Ipv4Addr, u16)>, why: impl core::fmt::Display) {
    let n = FAILED.fetch_add(1, Ordering::Relaxed) + 1;
    if n <= FAILURES_PRINTED {
        let (ip, port) = peer.unwrap_or((Ipv4Addr::UNSPECIFIED, 0));
        wisp::eprintln!("tlsproxy: handshake with {}:{} failed: {}{}", ip, port, why, if n == FAILURES_PRINTED { " (later failures are only counted)" } else { "" });
    }
}

/// One client: its handshake, then the relay to a backend connection.
/// The backend connection is opened as soon as the client's hello has
/// been accepted, while the client works on its side of the handshake:
/// its answer then finds the backend ready (a round trip and a wake-up of
/// this VM fewer a connection). Garbage never reaches the backend.
async fn serve(client: TcpStream, config: Arc<ServerConfig>, backend: (Ipv4Addr, u16)) {
    /// Counts a connection in `LIVE` while it is served.
    struct Live;
    impl Drop for Live {
        fn drop(&mut self) {
            LIVE.fetch_sub(1, Ordering::Relaxed);
        }
    }
    if LIVE.fetch_add(1, Ordering::Relaxed) >= MAX_LIVE.load(Ordering::Relaxed) {
        LIVE.fetch_sub(1, Ordering::Relaxed);
        REFUSED.fetch_add(1, Ordering::Relaxed);
        return; // (closed as it is dropped)
    }
    let _live = Live;
    let peer = client.peer_addr();
    let mut s = match Session::new(config) {
        Ok(s) => s,
        Err(e) => return failed(peer, e),
    };
    let mut buf = vec![0u8; 16 * 1024];
    let mut plain = Vec::new();
    let hello = core::cell::Cell::new(false);
    let handshake = timeout(HANDSHAKE_TIMEOUT, async {
        loop {
            let r = s.advance(&mut plain);
            if r.is_ok() && !s.out.is_empty() {
                hello.set(true);
            }
            // Even after an error: the alert rustls queued for the peer.
            let _ = send(&client, &mut s).await;
            if let Err(e) = r {
                return Err(alloc::format!("{}", e));
            }
            if s.established() {
                return Ok(());
            }
            match client.read(&mut buf).await {
                Ok(0) => return Err("the client closed the connection".into()),
                Ok(n) => {
                    BYTES_IN.fetch_add(n as u64, Ordering::Relaxed);
                    s.feed(&buf[..n]).map_err(|e| alloc::format!("{}", e))?;
                }
                Err(e) => return Err(alloc::format!("{}", e)),
            }
        }
    });
    let connect = async {
        // (Polled with the handshake, after it: it starts in the same pass
        // as the hello is accepted.)
        core::future::poll_fn(|_| if hello.get() { Poll::Ready(()) } else { Poll::Pending }).await;
        TcpStream::connect_with(backend.0, backend.1, TcpOptions { nodelay: true, ..TcpOptions::default() }).await
    };
    let mut connect = pin!(connect);
    let mut upstream = None;
    let done = {
        let mut handshake = pin!(handshake);
        core::future::poll_fn(|cx| {
            let r = handshake.as_mut().poll(cx);
            if upstream.is_none() {
                if let Poll::Ready(c) = connect.as_mut().poll(cx) {
                    upstream = Some(c);
                }
            }
            r
        })
        .await
    };
    match done {
        Some(Ok(())) => {}
        Some(Err(e)) => return failed(peer, e),
        None => return failed(peer, "not finished in 10 s"),
    }
    HANDSHAKES.fetch_add(1, Ordering::Relaxed);
    let upstream = match upstream {
        Some(c) => c,
        None => connect.await,
    };
    let upstream = match upstream {
        Ok(c) => c,
        Err(e) => {
            let n = BACKEND_FAILED.fetch_add(1, Ordering::Relaxed);
            if n < FAILURES_PRINTED {
                wisp::eprintln!("tlsproxy: backend {}:{}: {}", backend.0, backend.1, e);
            }
            let _ = s.close();
            let _ = send(&client, &mut s).await;
            return;
        }
    };
    drop(buf);
    let _ = relay::relay(&client, &upstream, &mut s, plain).await;
}

/// On a stop: the counters, then exit 0.
fn stop() {
    wisp::println!(
        "tlsproxy: counters handshakes={} failed={} backend_failed={} refused={} bytes_in={} bytes_out={}",
        HANDSHAKES.load(Ordering::Relaxed),
        FAILED.load(Ordering::Relaxed),
        BACKEND_FAILED.load(Ordering::Relaxed),
        REFUSED.load(Ordering::Relaxed),
        BYTES_IN.load(Ordering::Relaxed),
        BYTES_OUT.load(Ordering::Relaxed)
    );
    wisp::process::exit(0);
}
