//! Where migrations travel: a TCP address (`ADDRESS:PORT`, between hosts)
//! or a Unix socket (an absolute path, between daemons of one host or
//! through a tunnel that ends in one). One connection type for both, so
//! the protocol in `mod.rs` is written once.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

/// A migration's address: `ADDRESS:PORT`, or the absolute path of a Unix
/// socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for Addr {
    type Err = String;

    fn from_str(s: &str) -> Result<Addr, String> {
        if s.starts_with('/') {
            return Ok(Addr::Unix(PathBuf::from(s)));
        }
        s.parse().map(Addr::Tcp).map_err(|_| format!("{s:?}: expected ADDRESS:PORT or the absolute path of a Unix socket"))
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(a) => write!(f, "{a}"),
            Addr::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

/// One migration's connection.
pub enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    /// Connect to `addr`, within `timeout`; reads and writes time out after
    /// it too.
    pub fn connect(addr: &Addr, timeout: Duration) -> std::io::Result<Conn> {
        let c = match addr {
            Addr::Tcp(a) => {
                let s = TcpStream::connect_timeout(a, timeout)?;
                // Each message goes at once (they are answered).
                let _ = s.set_nodelay(true);
                Conn::Tcp(s)
            }
            Addr::Unix(p) => Conn::Unix(UnixStream::connect(p)?),
        };
        c.set_timeouts(timeout)?;
        Ok(c)
    }

    /// Reads and writes time out after `t`.
    pub fn set_timeouts(&self, t: Duration) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_read_timeout(Some(t)).and_then(|_| s.set_write_timeout(Some(t))),
            Conn::Unix(s) => s.set_read_timeout(Some(t)).and_then(|_| s.set_write_timeout(Some(t))),
        }
    }

    /// A second handle on the same connection (one reads, one writes).
    pub fn try_clone(&self) -> std::io::Result<Conn> {
        Ok(match self {
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
        })
    }

    /// Who is at the other end, for the log.
    pub fn peer(&self) -> String {
        match self {
            Conn::Tcp(s) => s.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string()),
            Conn::Unix(_) => "a Unix socket".into(),
        }
    }
}

impl Read for &Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => (&*s).read(buf),
            Conn::Unix(s) => (&*s).read(buf),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for &Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => (&*s).write(buf),
            Conn::Unix(s) => (&*s).write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Where a daemon takes migrations (`wispd --migrate-listen`).
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    /// Listen on `addr`. A Unix socket's path is taken over if a socket
    /// is there already (a daemon's before a restart); any other file there
    /// is left alone, and the bind fails.
    pub fn bind(addr: &Addr) -> std::io::Result<Listener> {
        Ok(match addr {
            Addr::Tcp(a) => Listener::Tcp(TcpListener::bind(a)?),
            Addr::Unix(p) => {
                use std::os::unix::fs::FileTypeExt;
                if std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket()) {
                    std::fs::remove_file(p)?;
                }
                Listener::Unix(UnixListener::bind(p)?)
            }
        })
    }

    /// The next connection.
    pub fn accept(&self) -> std::io::Result<Conn> {
        Ok(match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                let _ = s.set_nodelay(true);
                Conn::Tcp(s)
            }
            Listener::Unix(l) => Conn::Unix(l.accept()?.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_tcp_or_absolute_unix_paths() {
        assert_eq!("10.0.0.2:7799".parse::<Addr>(), Ok(Addr::Tcp("10.0.0.2:7799".parse().unwrap())));
        assert_eq!("/run/wisp/migrate.sock".parse::<Addr>(), Ok(Addr::Unix("/run/wisp/migrate.sock".into())));
        for bad in ["10.0.0.2", "host:port", "relative.sock", ""] {
            assert!(bad.parse::<Addr>().unwrap_err().contains("expected ADDRESS:PORT"), "{bad}");
        }
    }
}
