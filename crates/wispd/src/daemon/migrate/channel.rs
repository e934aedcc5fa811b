//! A migration's messages after the handshake, each authenticated: the two
//! daemons derive a session key from the shared key and both nonces,
//! HMAC-SHA256(key, "session" ‖ destination's nonce ‖ source's nonce), and
//! every message in each direction carries HMAC(session, direction ‖ its
//! number ‖ its bytes). So nothing on the path between two daemons that
//! proved the key to each other can change, add, drop or replay a header,
//! a snapshot or an answer unseen: a message that does not verify ends the
//! migration. (Not encrypted: guest memory crosses the wire readable, as
//! with the migration of other monitors over a private network.)

use std::io::{BufRead, Read, Write};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// One side's view of the authenticated messages.
pub struct Channel {
    key: [u8; 32],
    /// This side's direction label, and the other's.
    out: &'static [u8],
    inn: &'static [u8],
    sent: u64,
    got: u64,
}

impl Channel {
    /// The source's side (`shared`: the migration key; `dst`, `src`: the
    /// nonces of the handshake).
    pub fn source(shared: &[u8], dst: &[u8], src: &[u8]) -> Channel {
        Channel { key: session(shared, dst, src), out: b"s>d", inn: b"d>s", sent: 0, got: 0 }
    }

    /// The destination's side.
    pub fn destination(shared: &[u8], dst: &[u8], src: &[u8]) -> Channel {
        Channel { key: session(shared, dst, src), out: b"d>s", inn: b"s>d", sent: 0, got: 0 }
    }

    fn mac(&self, dir: &[u8], n: u64) -> Hmac<Sha256> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        m.update(dir);
        m.update(&n.to_le_bytes());
        m
    }

    /// The next outgoing message's MAC, to feed its bytes.
    pub fn next_out(&mut self) -> Hmac<Sha256> {
        self.sent += 1;
        self.mac(self.out, self.sent)
    }

    /// The next incoming message's MAC, to feed its bytes and verify.
    pub fn next_in(&mut self) -> Hmac<Sha256> {
        self.got += 1;
        self.mac(self.inn, self.got)
    }

    /// Send a line, then its tag (hex) on a line of its own.
    pub fn send_line(&mut self, w: &mut impl Write, text: &str) -> std::io::Result<()> {
        let mut m = self.next_out();
        m.update(text.as_bytes());
        writeln!(w, "{text}\n{}", super::hex(&m.finalize().into_bytes()))
    }

    /// A line (at most 4 KiB) and its tag, verified.
    pub fn recv_line(&mut self, r: &mut impl BufRead) -> Result<String, String> {
        let text = super::line(r).map_err(|e| e.to_string())?;
        let tag = super::line(r).map_err(|e| e.to_string())?;
        let mut m = self.next_in();
        m.update(text.as_bytes());
        let tag = super::unhex(&tag).ok_or("a malformed message tag")?;
        m.verify_slice(&tag).map_err(|_| "a message that does not verify (changed on the way?)".to_string())?;
        Ok(text)
    }
}

fn session(shared: &[u8], dst: &[u8], src: &[u8]) -> [u8; 32] {
    let mut m = super::mac(shared, b"session", dst);
    m.update(src);
    m.finalize().into_bytes().into()
}

/// A reader that feeds what it reads to a MAC.
pub struct Tee<'a, R> {
    pub inner: R,
    pub mac: &'a mut Hmac<Sha256>,
}

impl<R: Read> Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.mac.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_verifies_once_in_order_and_unchanged() {
        let (mut s, mut d) = (Channel::source(b"k", b"n1", b"n2"), Channel::destination(b"k", b"n1", b"n2"));
        let mut wire = Vec::new();
        s.send_line(&mut wire, "first").unwrap();
        s.send_line(&mut wire, "second").unwrap();
        let mut r = std::io::BufReader::new(&wire[..]);
        assert_eq!(d.recv_line(&mut r).unwrap(), "first");
        assert_eq!(d.recv_line(&mut r).unwrap(), "second");
        // Replayed, changed, or from a session of other nonces: refused.
        let mut d2 = Channel::destination(b"k", b"n1", b"n2");
        let mut wire2 = Vec::new();
        s.send_line(&mut wire2, "third").unwrap();
        assert!(d2.recv_line(&mut std::io::BufReader::new(&wire2[..])).is_err(), "out of order");
        let changed = String::from_utf8(wire.clone()).unwrap().replacen("first", "fir5t", 1);
        let mut d3 = Channel::destination(b"k", b"n1", b"n2");
        assert!(d3.recv_line(&mut std::io::BufReader::new(changed.as_bytes())).is_err(), "changed");
        let mut other = Channel::destination(b"k", b"n1", b"n3");
        assert!(other.recv_line(&mut std::io::BufReader::new(&wire[..])).is_err(), "another session");
        // And back the other way.
        let mut back = Vec::new();
        d.send_line(&mut back, "ok").unwrap();
        assert_eq!(s.recv_line(&mut std::io::BufReader::new(&back[..])).unwrap(), "ok");
    }
}
