//! Images for the daemon: resolving a request's image (an absolute path or
//! a bundled app's name) and the image cache: an image file is read and
//! validated once, copied into a sealed memfd, and that memfd is handed to
//! every VMM process that boots it (no VMM process opens image files
//! itself). Entries are keyed by the file's identity (device, inode, size,
//! modification time), so a changed file is read again.
//!
//! The cache holds at most a number of bytes of images: past it, the
//! least recently used entries go, except those a create holds right now
//! (between the look-up and the VMM process taking the memfd). A VM that
//! runs keeps its image's pages through its own descriptor, so eviction
//! never reaches a running VM; the next create of that image reads it
//! again. An image larger than the whole bound is used and not kept.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};
use rustix::io::Errno;
use wisp_vmm::Image;

/// Why an image cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A path that is not absolute (the daemon has no working directory of the client's).
    #[error("image path '{0}' must be absolute")]
    Relative(String),
    /// A name that is no bundled app.
    #[error("no such image: '{0}' is not a bundled app")]
    NoSuchApp(String),
    /// The file cannot be read.
    #[error("cannot read image {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    /// The file is not a valid image.
    #[error("{}: {source}", path.display())]
    Invalid { path: PathBuf, source: wisp_vmm::Error },
    /// The memfd that holds it.
    #[error("memfd: {0}")]
    Memfd(Errno),
    /// Copying it into the memfd.
    #[error("memfd write: {0}")]
    MemfdWrite(io::Error),
    /// Sealing the memfd.
    #[error("memfd seal: {0}")]
    MemfdSeal(Errno),
}

/// The file of `image`: an absolute path as it is, or a bundled app looked
/// up by name in `dirs`.
pub fn resolve(dirs: &[PathBuf], image: &str) -> Result<PathBuf, ImageError> {
    if image.contains('/') {
        let p = PathBuf::from(image);
        if !p.is_absolute() {
            return Err(ImageError::Relative(image.to_string()));
        }
        return Ok(p);
    }
    dirs.iter().map(|d| d.join(image)).find(|p| p.is_file()).ok_or_else(|| ImageError::NoSuchApp(image.to_string()))
}

/// A validated image in a sealed memfd.
pub struct CachedImage {
    /// Parsed image (entry, segments, name).
    pub image: Image,
    /// Its bytes, sealed against writes, growing and shrinking.
    pub memfd: OwnedFd,
}

type Key = (u64, u64, u64, i64, i64);

/// One cached image and when it was last used.
struct Slot {
    image: Arc<CachedImage>,
    used: u64,
}

/// Cache of images by file identity, at most `max_bytes` of them.
pub struct ImageCache {
    inner: Mutex<Inner>,
    max_bytes: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<(PathBuf, Key), Slot>,
    /// Bytes of every cached image.
    bytes: u64,
    /// Use counter (the clock of the LRU order).
    tick: u64,
}

impl CachedImage {
    fn size(&self) -> u64 {
        self.image.bytes.len() as u64
    }
}

impl ImageCache {
    /// An empty cache that keeps at most `max_bytes` of images.
    pub fn new(max_bytes: u64) -> ImageCache {
        ImageCache { inner: Mutex::default(), max_bytes }
    }

    /// Look `path` up, reading and validating it on a miss.
    pub fn get(&self, path: &Path) -> Result<Arc<CachedImage>, ImageError> {
        let meta = std::fs::metadata(path).map_err(|source| ImageError::Read { path: path.to_path_buf(), source })?;
        self.get_stat(path, &meta)
    }

    /// A request's image (see [`resolve`]): a bundled app's file is looked
    /// for and its identity read in one `stat` (a create's path).
    pub fn lookup(&self, dirs: &[PathBuf], image: &str) -> Result<Arc<CachedImage>, ImageError> {
        if image.contains('/') {
            return self.get(&resolve(dirs, image)?);
        }
        for path in dirs.iter().map(|d| d.join(image)) {
            if let Some(meta) = std::fs::metadata(&path).ok().filter(|m| m.is_file()) {
                return self.get_stat(&path, &meta);
            }
        }
        Err(ImageError::NoSuchApp(image.to_string()))
    }

    fn get_stat(&self, path: &Path, meta: &std::fs::Metadata) -> Result<Arc<CachedImage>, ImageError> {
        let key = (path.to_path_buf(), (meta.dev(), meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec()));
        {
            let mut c = self.inner.lock().unwrap();
            c.tick += 1;
            let tick = c.tick;
            if let Some(hit) = c.map.get_mut(&key) {
                hit.used = tick;
                return Ok(hit.image.clone());
            }
        }
        let entry = Arc::new(load(path)?);
        let mut c = self.inner.lock().unwrap();
        if entry.size() <= self.max_bytes && !c.map.contains_key(&key) {
            c.tick += 1;
            let used = c.tick;
            c.bytes += entry.size();
            c.map.insert(key.clone(), Slot { image: entry.clone(), used });
            self.evict(&mut c, &key);
        }
        Ok(entry)
    }

    /// Drop least recently used entries until the cache is within its
    /// bound, never one a create holds, and `keep` (just added) only if
    /// nothing else can go.
    fn evict(&self, c: &mut Inner, keep: &(PathBuf, Key)) {
        while c.bytes > self.max_bytes {
            let victim = c
                .map
                .iter()
                .filter(|(k, s)| *k != keep && Arc::strong_count(&s.image) == 1)
                .min_by_key(|(_, s)| s.used)
                .map(|(k, _)| k.clone());
            // Every other entry is in use: the new one is not kept either.
            let k = victim.unwrap_or_else(|| keep.clone());
            if let Some(s) = c.map.remove(&k) {
                c.bytes -= s.image.size();
            }
        }
    }

    /// Bytes of images cached now.
    #[cfg(test)]
    fn bytes(&self) -> u64 {
        self.inner.lock().unwrap().bytes
    }
}

/// Read, validate and seal image `path`.
fn load(path: &Path) -> Result<CachedImage, ImageError> {
    let image = Image::from_file(path).map_err(|source| ImageError::Invalid { path: path.to_path_buf(), source })?;
    let fd = memfd_create("wisp-image", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).map_err(ImageError::Memfd)?;
    let mut f = File::from(fd);
    f.write_all(&image.bytes).map_err(ImageError::MemfdWrite)?;
    let fd = OwnedFd::from(f);
    fcntl_add_seals(fd.as_fd(), SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL).map_err(ImageError::MemfdSeal)?;
    Ok(CachedImage { image, memfd: fd })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolving_images() {
        let dir = std::env::temp_dir().join(format!("wispd-images-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("app"), b"x").unwrap();
        let dirs = [PathBuf::from("/nonexistent"), dir.clone()];
        assert_eq!(resolve(&dirs, "app").unwrap(), dir.join("app"));
        assert_eq!(resolve(&dirs, "/abs/path").unwrap(), PathBuf::from("/abs/path"));
        assert_eq!(resolve(&dirs, "rel/path").unwrap_err().to_string(), "image path 'rel/path' must be absolute");
        assert_eq!(resolve(&dirs, "nope").unwrap_err().to_string(), "no such image: 'nope' is not a bundled app");
        let cache = ImageCache::new(256 << 20);
        for bad in ["rel/path", "nope"] {
            assert_eq!(cache.lookup(&dirs, bad).err().unwrap().to_string(), resolve(&dirs, bad).unwrap_err().to_string());
        }
        let e = ImageCache::new(256 << 20).get(&dir.join("app")).err().unwrap();
        assert!(e.to_string().starts_with(&format!("{}: ", dir.join("app").display())), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_cache_is_bounded_and_evicts_the_least_recently_used_image_not_in_use() {
        let images = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/images");
        if !images.join("hello").is_file() {
            panic!("guest images missing in {}: build them with `make guest`", images.display());
        }
        let (hello, noop, sleeper) = (images.join("hello"), images.join("noop"), images.join("sleeper"));
        let size = |p: &Path| Image::from_file(p).unwrap().bytes.len() as u64;
        let (h, n, s) = (size(&hello), size(&noop), size(&sleeper));
        // Room for any two of the three, not for all three.
        let cache = ImageCache::new(h + n + s - h.min(n).min(s));
        let held = cache.get(&hello).unwrap();
        cache.get(&noop).unwrap();
        assert_eq!(cache.bytes(), h + n);
        // hello is older, but a create holds it: noop goes.
        cache.get(&sleeper).unwrap();
        assert_eq!(cache.bytes(), h + s, "the image in use was evicted");
        assert!(Arc::ptr_eq(&held, &cache.get(&hello).unwrap()), "hello was read again");
        drop(held);
        // Now sleeper is the least recently used: noop replaces it.
        cache.get(&noop).unwrap();
        assert_eq!(cache.bytes(), h + n);
        // An image larger than the whole cache is served, not kept.
        let tiny = ImageCache::new(h - 1);
        let got = tiny.get(&hello).unwrap();
        assert_eq!((got.image.bytes.len() as u64, tiny.bytes()), (h, 0));
    }
}
