//! Read-only files the VM was given at start (`wisp run --file
//! HOST:GUEST`): whole files, by their absolute guest path, read in place
//! (no copy: a file is a `&'static [u8]` in the VM's memory). There is no
//! directory tree, no writing and no other file; the block device will add
//! volumes.
//!
//! ```ignore
//! match wisp::fs::read_to_str("/etc/app.conf") {
//!     Ok(text) => parse(text),
//!     Err(e) => wisp::eprintln!("app: {}", e),
//! }
//! ```

use core::fmt;

/// Why a file cannot be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// No file of that path was given.
    NotFound,
    /// It is not UTF-8 ([`read_to_str`]).
    NotUtf8,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::NotFound => "no such file (give it with wisp run --file HOST:GUEST)",
            Error::NotUtf8 => "the file is not UTF-8 text",
        })
    }
}

/// Every file: (guest path, size in bytes), in the order given.
pub fn files() -> impl Iterator<Item = (&'static str, usize)> {
    crate::env::data().into_iter().flat_map(|d| d.files()).filter_map(|(p, data)| Some((core::str::from_utf8(p).ok()?, data.len())))
}

/// The contents of the file at `path`.
pub fn read(path: &str) -> Result<&'static [u8], Error> {
    crate::env::data()
        .into_iter()
        .flat_map(|d| d.files())
        .find(|(p, _)| *p == path.as_bytes())
        .map(|(_, data)| data)
        .ok_or(Error::NotFound)
}

/// The contents of the file at `path`, as text.
pub fn read_to_str(path: &str) -> Result<&'static str, Error> {
    core::str::from_utf8(read(path)?).map_err(|_| Error::NotUtf8)
}

/// Whether a file of that path was given.
pub fn exists(path: &str) -> bool {
    read(path).is_ok()
}
