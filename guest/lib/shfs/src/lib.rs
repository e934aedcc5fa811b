//! SHFS, the volume format of the content cache (after MiniCache's SHFS):
//! a flat, hash-addressed object store. A volume is a run of chunks (4–32
//! KiB, fixed at `mkfs`): chunk 0 holds the [`Superblock`], the next
//! chunks a hash table of [`Entry`]s (one per object, in the bucket its
//! digest names), and the rest objects' contents, each in consecutive
//! chunks. The whole table is read at mount. An object is a *file* (its
//! bytes on the volume) or a *link* (an upstream URL the cache fetches
//! from). Every structure carries a CRC-32; a reader refuses a volume
//! whose superblock or any entry is malformed or inconsistent, with the
//! reason ([`Error`]).
//!
//! Crash safety (the writer's rule, `wisp shfs add`): an object's contents
//! go into free chunks and are made durable first; its entry, one 512-byte
//! write inside a chunk, commits it. A writer stopped in between leaves
//! only unreferenced chunks, which count as free. Removing writes the
//! entry's slot with zeros.
//!
//! `no_std`: parsing works on byte slices without allocating, for the
//! guest (which reads the table from its disk) and the host tool alike;
//! finding free chunks ([`Superblock::allocate`]) uses `alloc`. The
//! on-disk format is documented in `docs/shfs.md`.
#![no_std]

extern crate alloc;

use core::fmt;

/// `Superblock::magic`.
pub const MAGIC: [u8; 8] = *b"WISPSHFS";
/// The format's version.
pub const VERSION: u32 = 1;
/// Bytes of the superblock (at the start of chunk 0).
pub const SUPERBLOCK_SIZE: usize = 4096;
/// Bytes of an entry.
pub const ENTRY_SIZE: usize = 512;
/// Smallest and largest chunk.
pub const MIN_CHUNK: u32 = 4096;
/// Largest chunk.
pub const MAX_CHUNK: u32 = 32768;
/// Bytes of a digest (SHA-256).
pub const DIGEST_SIZE: usize = 32;
/// Longest MIME type, name and URL.
pub const MIME_MAX: usize = 48;
/// Longest human name.
pub const NAME_MAX: usize = 96;
/// Longest upstream URL of a link.
pub const URL_MAX: usize = 260;
/// Longest label.
pub const LABEL_MAX: usize = 32;

/// Why a volume or an entry is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// Not an SHFS volume (no magic).
    NotShfs,
    /// Another version of the format.
    Version(u32),
    /// The superblock's checksum does not match: it was damaged.
    SuperblockChecksum,
    /// The superblock's geometry does not hold together (what is wrong).
    Geometry(&'static str),
    /// The volume is shorter than its superblock says (truncated).
    Truncated {
        /// Bytes the superblock needs.
        need: u64,
        /// Bytes there are.
        have: u64,
    },
    /// Entry `slot`'s checksum does not match.
    EntryChecksum(u32),
    /// Entry `slot` is malformed (what is wrong).
    Entry(u32, &'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotShfs => f.write_str("not an SHFS volume (no WISPSHFS superblock; make one with wisp shfs mkfs)"),
            Error::Version(v) => write!(f, "SHFS version {v}, this reader knows version {VERSION}"),
            Error::SuperblockChecksum => f.write_str("the superblock's checksum does not match: the volume is damaged"),
            Error::Geometry(m) => write!(f, "the superblock's geometry is inconsistent: {m}"),
            Error::Truncated { need, have } => write!(f, "the volume is truncated: {have} bytes, its superblock needs {need}"),
            Error::EntryChecksum(s) => write!(f, "table entry {s}: its checksum does not match: the volume is damaged"),
            Error::Entry(s, m) => write!(f, "table entry {s}: {m}"),
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn crc(b: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(b);
    h.finalize()
}

/// The superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Bytes per chunk (a power of two, [`MIN_CHUNK`]..=[`MAX_CHUNK`]).
    pub chunk_size: u32,
    /// Chunks of the volume.
    pub chunks: u64,
    /// First chunk of the table.
    pub table_chunk: u64,
    /// Chunks of the table.
    pub table_chunks: u64,
    /// Buckets of the hash table.
    pub buckets: u32,
    /// Entries per bucket.
    pub bucket_entries: u32,
    /// When it was made (Unix seconds).
    pub created: u64,
    /// The label (NUL-padded).
    pub label: [u8; LABEL_MAX],
}

impl Superblock {
    /// A volume of `chunks` chunks of `chunk_size` bytes with room for at
    /// least `objects` objects (in buckets of 8).
    pub fn new(chunk_size: u32, chunks: u64, objects: u32, created: u64, label: &str) -> Result<Superblock, Error> {
        let bucket_entries = 8u32;
        let buckets = objects.div_ceil(bucket_entries).max(1);
        let table_bytes = buckets as u64 * bucket_entries as u64 * ENTRY_SIZE as u64;
        let mut l = [0u8; LABEL_MAX];
        let lb = label.as_bytes();
        if lb.len() > LABEL_MAX {
            return Err(Error::Geometry("the label is longer than 32 bytes"));
        }
        l[..lb.len()].copy_from_slice(lb);
        let sb = Superblock {
            chunk_size,
            chunks,
            table_chunk: 1,
            table_chunks: table_bytes.div_ceil(chunk_size as u64),
            buckets,
            bucket_entries,
            created,
            label: l,
        };
        sb.check()?;
        Ok(sb)
    }

    /// Parse and check the superblock at the start of `b` (at least
    /// [`SUPERBLOCK_SIZE`] bytes).
    pub fn parse(b: &[u8]) -> Result<Superblock, Error> {
        if b.len() < SUPERBLOCK_SIZE || b[..8] != MAGIC {
            return Err(Error::NotShfs);
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(Error::Version(version));
        }
        if crc(&b[..SUPERBLOCK_SIZE - 4]) != u32_at(b, SUPERBLOCK_SIZE - 4) {
            return Err(Error::SuperblockChecksum);
        }
        let mut label = [0u8; LABEL_MAX];
        label.copy_from_slice(&b[56..56 + LABEL_MAX]);
        let sb = Superblock {
            chunk_size: u32_at(b, 12),
            chunks: u64_at(b, 16),
            table_chunk: u64_at(b, 24),
            table_chunks: u64_at(b, 32),
            buckets: u32_at(b, 40),
            bucket_entries: u32_at(b, 44),
            created: u64_at(b, 48),
            label,
        };
        sb.check()?;
        Ok(sb)
    }

    fn check(&self) -> Result<(), Error> {
        let c = self.chunk_size;
        if !c.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&c) {
            return Err(Error::Geometry("the chunk size is not a power of two from 4 KiB to 32 KiB"));
        }
        if self.table_chunk != 1 || self.buckets == 0 || self.bucket_entries == 0 || self.bucket_entries > 64 {
            return Err(Error::Geometry("the table's position or bucket shape is wrong"));
        }
        let entries = self.buckets as u64 * self.bucket_entries as u64;
        if entries > 1 << 24 || entries * ENTRY_SIZE as u64 > self.table_chunks.saturating_mul(c as u64) {
            return Err(Error::Geometry("the table does not fit its chunks"));
        }
        if self.data_chunk().is_none_or(|d| d >= self.chunks) || self.chunks > (1 << 40) / c as u64 {
            return Err(Error::Geometry("no room for data after the table, or a volume over 1 TiB"));
        }
        Ok(())
    }

    /// The superblock's bytes.
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        let mut b = [0u8; SUPERBLOCK_SIZE];
        b[..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.chunk_size.to_le_bytes());
        b[16..24].copy_from_slice(&self.chunks.to_le_bytes());
        b[24..32].copy_from_slice(&self.table_chunk.to_le_bytes());
        b[32..40].copy_from_slice(&self.table_chunks.to_le_bytes());
        b[40..44].copy_from_slice(&self.buckets.to_le_bytes());
        b[44..48].copy_from_slice(&self.bucket_entries.to_le_bytes());
        b[48..56].copy_from_slice(&self.created.to_le_bytes());
        b[56..56 + LABEL_MAX].copy_from_slice(&self.label);
        let c = crc(&b[..SUPERBLOCK_SIZE - 4]);
        b[SUPERBLOCK_SIZE - 4..].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Bytes the volume needs.
    pub fn volume_bytes(&self) -> u64 {
        self.chunks * self.chunk_size as u64
    }

    /// Slots of the table.
    pub fn slots(&self) -> u32 {
        self.buckets * self.bucket_entries
    }

    /// Byte offset of the table.
    pub fn table_offset(&self) -> u64 {
        self.table_chunk * self.chunk_size as u64
    }

    /// Byte offset of slot `slot`'s entry.
    pub fn slot_offset(&self, slot: u32) -> u64 {
        self.table_offset() + slot as u64 * ENTRY_SIZE as u64
    }

    /// First chunk of data.
    pub fn data_chunk(&self) -> Option<u64> {
        self.table_chunk.checked_add(self.table_chunks)
    }

    /// The slots of the bucket `digest` belongs in.
    pub fn bucket_slots(&self, digest: &[u8; DIGEST_SIZE]) -> core::ops::Range<u32> {
        let b = (u64::from_le_bytes([digest[0], digest[1], digest[2], digest[3], digest[4], digest[5], digest[6], digest[7]]) % self.buckets as u64) as u32;
        b * self.bucket_entries..(b + 1) * self.bucket_entries
    }

    /// Chunks an object of `size` bytes takes.
    pub fn chunks_for(&self, size: u64) -> u64 {
        size.div_ceil(self.chunk_size as u64)
    }

    /// The first chunk of the first gap of `need` free chunks among the
    /// contents `objects` store (the writer's allocation: first fit).
    pub fn allocate<'a>(&self, objects: impl IntoIterator<Item = &'a Entry>, need: u64) -> Option<u64> {
        let mut used: alloc::vec::Vec<(u64, u64)> =
            objects.into_iter().filter(|e| e.stored()).map(|e| (e.start, e.start + e.chunks(self))).collect();
        used.sort();
        let mut at = self.data_chunk()?;
        for (s, e) in used {
            if s >= at + need {
                break;
            }
            at = at.max(e);
        }
        (at + need <= self.chunks).then_some(at)
    }

    /// The label as text.
    pub fn label(&self) -> &str {
        let n = self.label.iter().position(|&c| c == 0).unwrap_or(LABEL_MAX);
        core::str::from_utf8(&self.label[..n]).unwrap_or("?")
    }
}

/// What an object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Its bytes are on the volume.
    File = 1,
    /// It is fetched from an upstream URL.
    Link = 2,
}

/// One object of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its name: the SHA-256 digest of its contents (of a link: as given).
    pub digest: [u8; DIGEST_SIZE],
    /// File or link.
    pub kind: Kind,
    /// First chunk of the contents (0 for a link not fetched yet).
    pub start: u64,
    /// Bytes (of a link: 0 until fetched).
    pub size: u64,
    /// Last-Modified (Unix seconds).
    pub last_modified: u64,
    /// When it was added (Unix seconds).
    pub added: u64,
    /// Requests that found it.
    pub hits: u64,
    /// Requests that found it missing (a link not fetched yet).
    pub misses: u64,
    /// Bytes served of it.
    pub bytes_served: u64,
    /// Last request (Unix seconds, 0: never).
    pub last_access: u64,
    mime: [u8; MIME_MAX],
    mime_len: u8,
    name: [u8; NAME_MAX],
    name_len: u8,
    url: [u8; URL_MAX],
    url_len: u16,
}

fn put(dst: &mut [u8], s: &str, what: &'static str) -> Result<usize, &'static str> {
    let b = s.as_bytes();
    if b.len() > dst.len() || b.contains(&0) {
        return Err(what);
    }
    dst[..b.len()].copy_from_slice(b);
    Ok(b.len())
}

impl Entry {
    /// A new entry (statistics zero); `Err` names the field too long.
    #[allow(clippy::too_many_arguments)]
    pub fn new(digest: [u8; DIGEST_SIZE], kind: Kind, start: u64, size: u64, mime: &str, name: &str, url: &str, now: u64) -> Result<Entry, &'static str> {
        let mut e = Entry {
            digest,
            kind,
            start,
            size,
            last_modified: now,
            added: now,
            hits: 0,
            misses: 0,
            bytes_served: 0,
            last_access: 0,
            mime: [0; MIME_MAX],
            mime_len: 0,
            name: [0; NAME_MAX],
            name_len: 0,
            url: [0; URL_MAX],
            url_len: 0,
        };
        e.mime_len = put(&mut e.mime, mime, "the MIME type is longer than 48 bytes")? as u8;
        e.name_len = put(&mut e.name, name, "the name is longer than 96 bytes")? as u8;
        e.url_len = put(&mut e.url, url, "the URL is longer than 260 bytes")? as u16;
        Ok(e)
    }

    /// Parse slot `slot`'s bytes: `None` for an empty slot (all zeros).
    pub fn parse(slot: u32, b: &[u8; ENTRY_SIZE]) -> Result<Option<Entry>, Error> {
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if crc(&b[..ENTRY_SIZE - 4]) != u32_at(b, ENTRY_SIZE - 4) {
            return Err(Error::EntryChecksum(slot));
        }
        let kind = match b[32] {
            1 => Kind::File,
            2 => Kind::Link,
            _ => return Err(Error::Entry(slot, "unknown object kind")),
        };
        let (mime_len, name_len, url_len) = (b[33], b[34], u16::from_le_bytes([b[36], b[37]]));
        if mime_len as usize > MIME_MAX || name_len as usize > NAME_MAX || url_len as usize > URL_MAX {
            return Err(Error::Entry(slot, "a text field is longer than its room"));
        }
        let mut e = Entry {
            digest: [0; DIGEST_SIZE],
            kind,
            start: u64_at(b, 40),
            size: u64_at(b, 48),
            last_modified: u64_at(b, 56),
            added: u64_at(b, 64),
            hits: u64_at(b, 72),
            misses: u64_at(b, 80),
            bytes_served: u64_at(b, 88),
            last_access: u64_at(b, 96),
            mime: [0; MIME_MAX],
            mime_len,
            name: [0; NAME_MAX],
            name_len,
            url: [0; URL_MAX],
            url_len,
        };
        e.digest.copy_from_slice(&b[..DIGEST_SIZE]);
        e.mime.copy_from_slice(&b[104..104 + MIME_MAX]);
        e.name.copy_from_slice(&b[152..152 + NAME_MAX]);
        e.url.copy_from_slice(&b[248..248 + URL_MAX]);
        let utf8 = core::str::from_utf8(&e.mime[..mime_len as usize]).is_ok()
            && core::str::from_utf8(&e.name[..name_len as usize]).is_ok()
            && core::str::from_utf8(&e.url[..url_len as usize]).is_ok();
        if !utf8 {
            return Err(Error::Entry(slot, "a text field is not UTF-8"));
        }
        if kind == Kind::Link && url_len == 0 {
            return Err(Error::Entry(slot, "a link without a URL"));
        }
        Ok(Some(e))
    }

    /// Whether its contents are on the volume (a file, or a link fetched
    /// and stored: `start` set).
    pub fn stored(&self) -> bool {
        self.kind == Kind::File || self.start != 0
    }

    /// Check the entry against the volume `sb`: in its digest's bucket,
    /// stored contents inside the data area.
    pub fn check(&self, slot: u32, sb: &Superblock) -> Result<(), Error> {
        if !sb.bucket_slots(&self.digest).contains(&slot) {
            return Err(Error::Entry(slot, "not in the bucket of its digest"));
        }
        if self.stored() {
            let data = sb.data_chunk().unwrap_or(u64::MAX);
            let end = self.start.checked_add(sb.chunks_for(self.size));
            if self.start < data || end.is_none_or(|e| e > sb.chunks) {
                return Err(Error::Entry(slot, "its chunks lie outside the data area"));
            }
        }
        Ok(())
    }

    /// The entry's bytes.
    pub fn encode(&self) -> [u8; ENTRY_SIZE] {
        let mut b = [0u8; ENTRY_SIZE];
        b[..DIGEST_SIZE].copy_from_slice(&self.digest);
        b[32] = self.kind as u8;
        b[33] = self.mime_len;
        b[34] = self.name_len;
        b[36..38].copy_from_slice(&self.url_len.to_le_bytes());
        for (at, v) in [
            (40, self.start),
            (48, self.size),
            (56, self.last_modified),
            (64, self.added),
            (72, self.hits),
            (80, self.misses),
            (88, self.bytes_served),
            (96, self.last_access),
        ] {
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        b[104..104 + MIME_MAX].copy_from_slice(&self.mime);
        b[152..152 + NAME_MAX].copy_from_slice(&self.name);
        b[248..248 + URL_MAX].copy_from_slice(&self.url);
        let c = crc(&b[..ENTRY_SIZE - 4]);
        b[ENTRY_SIZE - 4..].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// The MIME type.
    pub fn mime(&self) -> &str {
        core::str::from_utf8(&self.mime[..self.mime_len as usize]).unwrap_or("")
    }

    /// The human name ("" if none).
    pub fn name(&self) -> &str {
        core::str::from_utf8(&self.name[..self.name_len as usize]).unwrap_or("")
    }

    /// A link's URL ("" for a file).
    pub fn url(&self) -> &str {
        core::str::from_utf8(&self.url[..self.url_len as usize]).unwrap_or("")
    }

    /// Chunks it takes on `sb` (0 for a link not stored).
    pub fn chunks(&self, sb: &Superblock) -> u64 {
        if self.stored() {
            sb.chunks_for(self.size)
        } else {
            0
        }
    }
}

/// `digest` in lower-case hexadecimal.
pub fn hex(digest: &[u8; DIGEST_SIZE]) -> [u8; 2 * DIGEST_SIZE] {
    const H: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 2 * DIGEST_SIZE];
    for (i, b) in digest.iter().enumerate() {
        out[2 * i] = H[(b >> 4) as usize];
        out[2 * i + 1] = H[(b & 15) as usize];
    }
    out
}

/// A digest from 64 hexadecimal digits (either case).
pub fn parse_hex(s: &str) -> Option<[u8; DIGEST_SIZE]> {
    let b = s.as_bytes();
    if b.len() != 2 * DIGEST_SIZE {
        return None;
    }
    let nib = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut d = [0u8; DIGEST_SIZE];
    for i in 0..DIGEST_SIZE {
        d[i] = nib(b[2 * i])? << 4 | nib(b[2 * i + 1])?;
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        Superblock::new(16384, 4096, 1000, 1_700_000_000, "test").unwrap()
    }

    #[test]
    fn superblock_round_trip_and_damage() {
        let s = sb();
        assert_eq!((s.buckets, s.bucket_entries, s.table_chunks), (125, 8, 32));
        let b = s.encode();
        assert_eq!(Superblock::parse(&b), Ok(s));
        assert_eq!(s.label(), "test");
        let mut bad = b;
        bad[20] ^= 1;
        assert_eq!(Superblock::parse(&bad), Err(Error::SuperblockChecksum));
        assert_eq!(Superblock::parse(&b[..100]), Err(Error::NotShfs));
        let mut v2 = b;
        v2[8] = 2;
        assert_eq!(Superblock::parse(&v2), Err(Error::Version(2)));
        assert!(matches!(Superblock::new(5000, 4096, 10, 0, ""), Err(Error::Geometry(_))));
        assert!(matches!(Superblock::new(4096, 3, 1000, 0, ""), Err(Error::Geometry(_))), "no room for data");
        // Any byte changed, a clear error, never a panic.
        for i in 0..SUPERBLOCK_SIZE {
            let mut x = b;
            x[i] ^= 0x5a;
            assert!(Superblock::parse(&x).is_err(), "byte {i}");
        }
    }

    #[test]
    fn entry_round_trip_damage_and_checks() {
        let s = sb();
        let mut d = [7u8; 32];
        d[0] = 3;
        let e = Entry::new(d, Kind::File, s.data_chunk().unwrap(), 40_000, "text/plain", "a.txt", "", 5).unwrap();
        let slot = s.bucket_slots(&d).start;
        let b = e.encode();
        assert_eq!(Entry::parse(slot, &b), Ok(Some(e)));
        assert_eq!((e.name(), e.mime(), e.chunks(&s)), ("a.txt", "text/plain", 3));
        assert_eq!(e.check(slot, &s), Ok(()));
        assert!(e.check(slot + s.bucket_entries, &s).is_err(), "another bucket");
        assert_eq!(Entry::parse(0, &[0; ENTRY_SIZE]), Ok(None));
        let mut bad = b;
        bad[50] ^= 1;
        assert_eq!(Entry::parse(9, &bad), Err(Error::EntryChecksum(9)));
        let far = Entry::new(d, Kind::File, s.chunks - 1, 40_000, "", "", "", 0).unwrap();
        assert!(far.check(slot, &s).is_err(), "past the end");
        let low = Entry::new(d, Kind::File, 1, 10, "", "", "", 0).unwrap();
        assert!(low.check(slot, &s).is_err(), "in the table");
        assert!(Entry::new(d, Kind::Link, 0, 0, "", "x", &"u".repeat(300), 0).is_err());
        for i in 0..ENTRY_SIZE {
            let mut x = b;
            x[i] ^= 0x5a;
            let _ = Entry::parse(1, &x);
        }
    }

    #[test]
    fn allocation_takes_the_first_gap() {
        let s = sb();
        let d0 = s.data_chunk().unwrap();
        let file = |start, size| Entry::new([1; 32], Kind::File, start, size, "", "", "", 0).unwrap();
        let link = Entry::new([2; 32], Kind::Link, 0, 0, "", "", "http://x/", 0).unwrap();
        assert_eq!(s.allocate(&[], 3), Some(d0));
        // 16 KiB chunks: 40,000 bytes take 3.
        let taken = [file(d0, 40_000), file(d0 + 5, 16_384), link];
        assert_eq!(s.allocate(&taken, 2), Some(d0 + 3));
        assert_eq!(s.allocate(&taken, 3), Some(d0 + 6));
        assert_eq!(s.allocate(&taken, s.chunks), None);
    }

    #[test]
    fn hex_round_trip() {
        let d: [u8; 32] = core::array::from_fn(|i| (i * 37) as u8);
        let h = hex(&d);
        assert_eq!(parse_hex(core::str::from_utf8(&h).unwrap()), Some(d));
        assert_eq!(parse_hex("zz"), None);
    }
}
