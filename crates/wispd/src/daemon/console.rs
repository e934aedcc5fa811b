//! A VM's console output, as the daemon hands it to the API.

use std::io::{self, BufReader, Cursor, Read};
use std::os::unix::net::UnixStream;

/// A VM's console output as a stream: live from its VMM process (until
/// the VM ends), or the buffer the VMM process saved when it ended.
pub enum Console {
    /// From the VMM process.
    Live(BufReader<UnixStream>),
    /// Saved (`console.log`).
    Saved(Cursor<Vec<u8>>),
}

impl Read for Console {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Console::Live(r) => r.read(buf),
            Console::Saved(r) => r.read(buf),
        }
    }
}
