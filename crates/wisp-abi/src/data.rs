//! The data region ([`crate::DeviceKind::Data`]): the environment and the
//! read-only files a VM is given at start (`wisp run -e K=V --file
//! HOST:GUEST`), written by the monitor before the first instruction. Its
//! device-table entry gives `base` and `size`; nothing else is kicked or
//! shared with the host afterwards.
//!
//! ```text
//! 0   DataHeader (32 bytes)
//!     env: `KEY=VALUE\0` entries, env_len bytes at env_off
//!     file table: file_count FileEntry (24 bytes each) at files_off
//!     names and contents, where the entries point
//! ```
//!
//! All offsets count from the region's first byte and are checked by
//! [`DataRegion::parse`] and its iterators against the region (an entry
//! pointing outside is skipped), so a guest reading a region it wrote over
//! itself gets nothing wrong, only less.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `DataHeader::magic`: "WISPDATA" in little endian.
pub const DATA_MAGIC: u64 = u64::from_le_bytes(*b"WISPDATA");
/// Largest environment (all `KEY=VALUE\0` entries together).
pub const MAX_ENV_BYTES: usize = 64 * 1024;
/// Most files in a region.
pub const MAX_FILES: usize = 1024;
/// Longest guest path of a file.
pub const MAX_PATH: usize = 255;

/// The region's header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct DataHeader {
    /// [`DATA_MAGIC`].
    pub magic: u64,
    /// Number of environment entries.
    pub env_count: u32,
    /// Bytes of environment entries.
    pub env_len: u32,
    /// Offset of the first entry.
    pub env_off: u32,
    /// Number of files.
    pub file_count: u32,
    /// Offset of the file table.
    pub files_off: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// One file of the file table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FileEntry {
    /// Offset of the file's guest path (UTF-8, absolute, no NUL).
    pub name_off: u32,
    /// Its length.
    pub name_len: u32,
    /// Offset of the contents.
    pub data_off: u64,
    /// Bytes of contents.
    pub size: u64,
}

/// Size of [`DataHeader`].
pub const HEADER_SIZE: usize = core::mem::size_of::<DataHeader>();
/// Size of [`FileEntry`].
pub const ENTRY_SIZE: usize = core::mem::size_of::<FileEntry>();

/// A data region as the guest reads it.
#[derive(Clone, Copy, Debug)]
pub struct DataRegion<'a> {
    bytes: &'a [u8],
    header: DataHeader,
}

fn range(bytes: &[u8], off: u64, len: u64) -> Option<&[u8]> {
    let end = off.checked_add(len)?;
    bytes.get(usize::try_from(off).ok()?..usize::try_from(end).ok()?)
}

impl<'a> DataRegion<'a> {
    /// The region in `bytes`, if it starts with a header of this ABI.
    pub fn parse(bytes: &'a [u8]) -> Option<DataRegion<'a>> {
        let (header, _) = DataHeader::read_from_prefix(bytes).ok()?;
        (header.magic == DATA_MAGIC).then_some(DataRegion { bytes, header })
    }

    /// The environment entries as (key, value), in order.
    pub fn env(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        let h = self.header;
        range(self.bytes, h.env_off as u64, h.env_len as u64)
            .unwrap_or(&[])
            .split(|&b| b == 0)
            .take(h.env_count as usize)
            .filter_map(|e| e.iter().position(|&b| b == b'=').map(|i| (&e[..i], &e[i + 1..])))
    }

    /// The files as (guest path, contents), in order.
    pub fn files(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        let (bytes, h) = (self.bytes, self.header);
        let count = (h.file_count as usize).min(MAX_FILES);
        (0..count).filter_map(move |i| {
            let at = (h.files_off as u64).checked_add((i * ENTRY_SIZE) as u64)?;
            let (e, _) = FileEntry::read_from_prefix(range(bytes, at, ENTRY_SIZE as u64)?).ok()?;
            Some((range(bytes, e.name_off as u64, e.name_len as u64)?, range(bytes, e.data_off, e.size)?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A region with `A=1`, `B=x=y` and one file `/etc/c` = "hi".
    fn sample() -> [u8; 128] {
        let mut r = [0u8; 128];
        let h = DataHeader { magic: DATA_MAGIC, env_count: 2, env_len: 10, env_off: 32, file_count: 1, files_off: 48, reserved: 0 };
        r[..32].copy_from_slice(h.as_bytes());
        r[32..42].copy_from_slice(b"A=1\0B=x=y\0");
        let e = FileEntry { name_off: 72, name_len: 6, data_off: 80, size: 2 };
        r[48..72].copy_from_slice(e.as_bytes());
        r[72..78].copy_from_slice(b"/etc/c");
        r[80..82].copy_from_slice(b"hi");
        r
    }

    #[test]
    fn reads_env_and_files() {
        let r = sample();
        let d = DataRegion::parse(&r).unwrap();
        let mut env = d.env();
        assert_eq!(env.next(), Some((&b"A"[..], &b"1"[..])));
        assert_eq!(env.next(), Some((&b"B"[..], &b"x=y"[..])));
        assert_eq!(env.next(), None);
        let mut files = d.files();
        assert_eq!(files.next(), Some((&b"/etc/c"[..], &b"hi"[..])));
        assert_eq!(files.next(), None);
    }

    #[test]
    fn out_of_range_entries_are_skipped_never_read() {
        assert!(DataRegion::parse(&[0u8; 16]).is_none());
        let mut r = sample();
        r[0] ^= 1;
        assert!(DataRegion::parse(&r).is_none());
        let mut r = sample();
        r[64..72].copy_from_slice(&u64::MAX.to_le_bytes()); // size
        assert_eq!(DataRegion::parse(&r).unwrap().files().count(), 0);
        let mut r = sample();
        r[12..16].copy_from_slice(&u32::MAX.to_le_bytes()); // env_len
        assert_eq!(DataRegion::parse(&r).unwrap().env().count(), 0);
        // Every byte of the header and table changed: nothing panics.
        for i in 0..72 {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut r = sample();
                r[i] = v;
                if let Some(d) = DataRegion::parse(&r) {
                    let _ = (d.env().count(), d.files().count());
                }
            }
        }
    }
}
