//! The mounted SHFS volume: its table read whole at mount (a volume that
//! is not SHFS, damaged or truncated is refused with the reason), objects
//! found by digest or name, their bytes read from the disk in whole
//! sectors and kept in a cache of whole objects (up to a budget of bytes,
//! the oldest dropped first), and per-object statistics.

use alloc::collections::VecDeque;
use alloc::format;
use alloc::rc::Rc;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use shfs::{Entry, Superblock, DIGEST_SIZE, ENTRY_SIZE, SUPERBLOCK_SIZE};
use wisp::blk::Disk;
use wisp::collections::HashMap;

/// Why an object's bytes could not be had.
#[derive(Debug)]
pub enum ReadError {
    Disk(wisp::blk::Error),
    NoMemory,
}

impl core::fmt::Display for ReadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ReadError::Disk(e) => write!(f, "{}", e),
            ReadError::NoMemory => f.write_str("out of memory"),
        }
    }
}

/// Bytes read from the volume's start at mount: the superblock and a table
/// of up to 64 entries (each page the guest reads first costs it ~4 µs).
const FIRST_READ: u64 = 36 << 10;

/// Objects up to this size are cached whole.
pub const CACHE_OBJECT_MAX: u64 = 4 << 20;
/// Bytes read from the disk at a time for a larger object.
pub const PIECE: u64 = 256 << 10;

/// The volume.
pub struct Store {
    pub disk: Disk,
    pub sb: Superblock,
    /// Objects by digest: (table slot, entry).
    objects: HashMap<[u8; DIGEST_SIZE], (u32, Entry)>,
    names: HashMap<String, [u8; DIGEST_SIZE]>,
    cache: HashMap<[u8; DIGEST_SIZE], Rc<Vec<u8>>>,
    order: VecDeque<[u8; DIGEST_SIZE]>,
    cached: u64,
    budget: u64,
    /// Slots whose statistics changed since they were last written.
    dirty: Vec<u32>,
}

impl Store {
    /// Mount the volume on `disk`, caching at most `budget` bytes.
    pub fn mount(disk: Disk, budget: u64) -> Result<Store, String> {
        // The superblock and, on most volumes, the whole table after it in
        // one read (a request costs more than its bytes).
        let first = (disk.capacity() & !4095).clamp(SUPERBLOCK_SIZE as u64, FIRST_READ) as usize;
        let mut head = vec![0u8; first];
        disk.read(0, &mut head).map_err(|e| format!("reading the superblock: {}", e))?;
        let sb = Superblock::parse(&head[..SUPERBLOCK_SIZE]).map_err(|e| e.to_string())?;
        if disk.capacity() < sb.volume_bytes() {
            return Err(shfs::Error::Truncated { need: sb.volume_bytes(), have: disk.capacity() }.to_string());
        }
        let table_len = (sb.slots() as u64 * ENTRY_SIZE as u64).next_multiple_of(4096);
        let (start, end) = (sb.table_offset(), sb.table_offset() + table_len);
        let table = if end <= first as u64 {
            head.truncate(end as usize);
            head.drain(..start as usize);
            head
        } else {
            let mut table = vec![0u8; table_len as usize];
            disk.read(start, &mut table).map_err(|e| format!("reading the table: {}", e))?;
            table
        };
        let mut objects = HashMap::new();
        let mut names = HashMap::new();
        for slot in 0..sb.slots() {
            let at = slot as usize * ENTRY_SIZE;
            let raw: &[u8; ENTRY_SIZE] = table[at..at + ENTRY_SIZE].try_into().expect("whole entries");
            let Some(e) = Entry::parse(slot, raw).map_err(|e| e.to_string())? else { continue };
            e.check(slot, &sb).map_err(|e| e.to_string())?;
            if !e.name().is_empty() {
                names.insert(e.name().to_string(), e.digest);
            }
            objects.insert(e.digest, (slot, e));
        }
        Ok(Store { disk, sb, objects, names, cache: HashMap::new(), order: VecDeque::new(), cached: 0, budget, dirty: Vec::new() })
    }

    /// Objects on the volume.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// The object a request path names: `/<64 hex digits>`, or a name.
    pub fn lookup(&self, path: &str) -> Option<Entry> {
        if let Some(d) = self.names.get(path) {
            return self.objects.get(d).map(|o| o.1);
        }
        let d = shfs::parse_hex(path.strip_prefix('/')?)?;
        self.objects.get(&d).map(|o| o.1)
    }

    /// Count a request of `e` that found it (`hit`) or not, and `bytes` sent.
    pub fn count(&mut self, digest: &[u8; DIGEST_SIZE], hit: bool, bytes: u64, now: u64) {
        if let Some((slot, e)) = self.objects.get_mut(digest) {
            if !self.dirty.contains(slot) {
                self.dirty.push(*slot);
            }
            if hit {
                e.hits += 1;
            } else {
                e.misses += 1;
            }
            e.bytes_served += bytes;
            e.last_access = now;
        }
    }

    /// Bytes `[start, end)` of file `e`: from the cache (a small object,
    /// read whole once), else read from the disk (whole sectors around
    /// them).
    pub fn bytes(&mut self, e: &Entry, start: u64, end: u64) -> Result<Rc<Vec<u8>>, ReadError> {
        if e.size <= CACHE_OBJECT_MAX {
            let whole = match self.cache.get(&e.digest) {
                Some(b) => b.clone(),
                None => {
                    let b = Rc::new(self.read(e, 0, e.size)?);
                    self.keep(e.digest, b.clone());
                    b
                }
            };
            if start == 0 && end == e.size {
                return Ok(whole);
            }
            let part = &whole[start as usize..end as usize];
            let mut v = Vec::new();
            v.try_reserve_exact(part.len()).map_err(|_| ReadError::NoMemory)?;
            v.extend_from_slice(part);
            return Ok(Rc::new(v));
        }
        Ok(Rc::new(self.read(e, start, end)?))
    }

    /// (Memory for the bytes is asked for, not assumed: with thousands of
    /// connections the heap may be short, and one answer failing is
    /// better than the VM.)
    fn read(&self, e: &Entry, start: u64, end: u64) -> Result<Vec<u8>, ReadError> {
        let base = e.start * self.sb.chunk_size as u64;
        let from = (base + start) / 4096 * 4096;
        let to = (base + end).next_multiple_of(4096);
        let mut buf = Vec::new();
        buf.try_reserve_exact((to - from) as usize).map_err(|_| ReadError::NoMemory)?;
        buf.resize((to - from) as usize, 0);
        self.disk.read(from, &mut buf).map_err(ReadError::Disk)?;
        let skip = (base + start - from) as usize;
        buf.drain(..skip);
        buf.truncate((end - start) as usize);
        Ok(buf)
    }

    /// Store the fetched body `data` of link `e`: its chunks written in the
    /// first gap and made durable, then its entry (start, size, date), one
    /// sector rewritten. Nothing is referenced before the last step.
    pub fn commit_fetched(&mut self, e: &Entry, data: &[u8]) -> Result<(), String> {
        if self.disk.read_only() {
            return Err("the volume is read-only".into());
        }
        let &(slot, current) = self.objects.get(&e.digest).ok_or("the link was removed meanwhile")?;
        if current.stored() {
            return Ok(());
        }
        let need = self.sb.chunks_for(data.len() as u64).max(1);
        let at = self.sb.allocate(self.objects.values().map(|o| &o.1), need).ok_or_else(|| format!("no room for {} bytes on the volume", data.len()))?;
        let mut padded = data.to_vec();
        padded.resize((need * self.sb.chunk_size as u64) as usize, 0);
        let err = |e: wisp::blk::Error| format!("{}", e);
        self.disk.write(at * self.sb.chunk_size as u64, &padded).map_err(err)?;
        self.disk.flush().map_err(err)?;
        let mut stored = current;
        stored.start = at;
        stored.size = data.len() as u64;
        stored.last_modified = wisp::time::wall_ns() / 1_000_000_000;
        self.write_entry(slot, &stored.encode())?;
        self.objects.insert(e.digest, (slot, stored));
        Ok(())
    }

    /// Write slot `slot`'s 512 bytes (its sector read, patched, written,
    /// flushed).
    fn write_entry(&self, slot: u32, bytes: &[u8; ENTRY_SIZE]) -> Result<(), String> {
        if self.disk.read_only() {
            return Err("the volume is read-only".into());
        }
        let err = |e: wisp::blk::Error| format!("{}", e);
        let off = self.sb.slot_offset(slot);
        let sector = off / 4096 * 4096;
        let mut sec = vec![0u8; 4096];
        self.disk.read(sector, &mut sec).map_err(err)?;
        let i = (off - sector) as usize;
        sec[i..i + ENTRY_SIZE].copy_from_slice(bytes);
        self.disk.write(sector, &sec).map_err(err)?;
        self.disk.flush().map_err(err)
    }

    /// Every object's entry.
    pub fn entries(&self) -> Vec<Entry> {
        let mut v: Vec<Entry> = self.objects.values().map(|o| o.1).collect();
        v.sort_by(|a, b| a.name().cmp(b.name()).then(a.digest.cmp(&b.digest)));
        v
    }

    /// Bytes of objects in memory.
    pub fn cached_bytes(&self) -> u64 {
        self.cached
    }

    fn find(&self, what: &str) -> Option<(u32, Entry)> {
        let d = match self.names.get(what) {
            Some(d) => *d,
            None => shfs::parse_hex(what.trim_start_matches('/'))?,
        };
        self.objects.get(&d).copied()
    }

    /// Add a link to `url` (named `name`, if any); its digest is the
    /// SHA-256 of the URL.
    pub fn add_link(&mut self, url: &str, name: &str) -> Result<[u8; DIGEST_SIZE], String> {
        use sha2::Digest;
        if !url.starts_with("http://") {
            return Err(format!("'{}' is not an http:// URL", url));
        }
        let d: [u8; DIGEST_SIZE] = sha2::Sha256::digest(url.as_bytes()).into();
        if self.objects.contains_key(&d) || (!name.is_empty() && self.names.contains_key(name)) {
            return Err("it is there already".into());
        }
        let now = wisp::time::wall_ns() / 1_000_000_000;
        let e = Entry::new(d, shfs::Kind::Link, 0, 0, "application/octet-stream", name, url, now).map_err(String::from)?;
        let taken: Vec<u32> = self.objects.values().map(|o| o.0).collect();
        let slot = self.sb.bucket_slots(&d).find(|s| !taken.contains(s)).ok_or("the table's bucket for it is full")?;
        self.write_entry(slot, &e.encode())?;
        if !name.is_empty() {
            self.names.insert(name.to_string(), d);
        }
        self.objects.insert(d, (slot, e));
        Ok(d)
    }

    fn evict(&mut self, d: &[u8; DIGEST_SIZE]) {
        if let Some(b) = self.cache.remove(d) {
            self.cached -= b.len() as u64;
            self.order.retain(|x| x != d);
        }
    }

    /// Remove an object from the volume (its chunks become free).
    pub fn remove(&mut self, what: &str) -> Result<String, String> {
        let (slot, e) = self.find(what).ok_or_else(|| format!("no object '{}'", what))?;
        self.write_entry(slot, &[0; ENTRY_SIZE])?;
        self.evict(&e.digest);
        self.objects.remove(&e.digest);
        self.names.retain(|_, d| *d != e.digest);
        Ok(format!("removed {}", String::from_utf8_lossy(&shfs::hex(&e.digest))))
    }

    /// Purge an object: out of memory, and a fetched link's stored copy
    /// forgotten (the next request fetches it again).
    pub fn purge(&mut self, what: &str) -> Result<String, String> {
        let (slot, e) = self.find(what).ok_or_else(|| format!("no object '{}'", what))?;
        self.evict(&e.digest);
        if e.kind == shfs::Kind::Link && e.stored() {
            let mut fresh = e;
            fresh.start = 0;
            fresh.size = 0;
            self.write_entry(slot, &fresh.encode())?;
            self.objects.insert(e.digest, (slot, fresh));
        }
        Ok(format!("purged {}", String::from_utf8_lossy(&shfs::hex(&e.digest))))
    }

    /// Write every object's statistics back to its entry.
    pub fn save_stats(&mut self) -> Result<String, String> {
        let all: Vec<(u32, Entry)> = self.objects.values().copied().collect();
        for (slot, e) in &all {
            self.write_entry(*slot, &e.encode())?;
        }
        self.dirty.clear();
        Ok(format!("statistics of {} objects saved", all.len()))
    }

    /// Write back the statistics that changed since they were last written
    /// (the periodic write-back); how many entries were written.
    pub fn save_changed_stats(&mut self) -> Result<usize, String> {
        let slots = core::mem::take(&mut self.dirty);
        let mut n = 0;
        for slot in &slots {
            // (An object removed meanwhile has no entry left to update.)
            if let Some(e) = self.objects.values().find(|o| o.0 == *slot).map(|o| o.1) {
                if let Err(err) = self.write_entry(*slot, &e.encode()) {
                    self.dirty = slots;
                    return Err(err);
                }
                n += 1;
            }
        }
        Ok(n)
    }

    fn keep(&mut self, d: [u8; DIGEST_SIZE], b: Rc<Vec<u8>>) {
        self.cached += b.len() as u64;
        self.cache.insert(d, b);
        self.order.push_back(d);
        while self.cached > self.budget {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(b) = self.cache.remove(&old) {
                self.cached -= b.len() as u64;
            }
        }
    }
}
