//! The image cache: an image file is read and validated once, copied into a
//! sealed memfd, and that memfd is handed to every VMM process that boots it
//! (no VMM process opens image files itself). Entries are keyed by the
//! file's identity (device, inode, size, modification time), so a changed
//! file is read again.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};
use wisp_vmm::Image;

/// A validated image in a sealed memfd.
pub struct CachedImage {
    /// Parsed image (entry, segments, name).
    pub image: Image,
    /// Its bytes, sealed against writes, growing and shrinking.
    pub memfd: OwnedFd,
}

type Key = (u64, u64, u64, i64, i64);

/// Cache of images by file identity.
#[derive(Default)]
pub struct ImageCache {
    map: Mutex<HashMap<(PathBuf, Key), Arc<CachedImage>>>,
}

impl ImageCache {
    /// Look `path` up, reading and validating it on a miss.
    pub fn get(&self, path: &Path) -> Result<Arc<CachedImage>, String> {
        let meta = std::fs::metadata(path).map_err(|e| format!("cannot read image {}: {e}", path.display()))?;
        let key = (meta.dev(), meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec());
        if let Some(hit) = self.map.lock().unwrap().get(&(path.to_path_buf(), key)) {
            return Ok(hit.clone());
        }
        let image = Image::from_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let fd = memfd_create("wisp-image", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| format!("memfd: {e}"))?;
        let mut f = File::from(fd);
        f.write_all(&image.bytes).map_err(|e| format!("memfd write: {e}"))?;
        let fd = OwnedFd::from(f);
        fcntl_add_seals(fd.as_fd(), SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL)
            .map_err(|e| format!("memfd seal: {e}"))?;
        let entry = Arc::new(CachedImage { image, memfd: fd });
        self.map.lock().unwrap().insert((path.to_path_buf(), key), entry.clone());
        Ok(entry)
    }
}
