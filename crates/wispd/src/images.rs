//! Images for the daemon: resolving a request's image (an absolute path or
//! a bundled app's name) and the image cache: an image file is read and
//! validated once, copied into a sealed memfd, and that memfd is handed to
//! every VMM process that boots it (no VMM process opens image files
//! itself). Entries are keyed by the file's identity (device, inode, size,
//! modification time), so a changed file is read again.

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

/// Cache of images by file identity.
#[derive(Default)]
pub struct ImageCache {
    map: Mutex<HashMap<(PathBuf, Key), Arc<CachedImage>>>,
}

impl ImageCache {
    /// Look `path` up, reading and validating it on a miss.
    pub fn get(&self, path: &Path) -> Result<Arc<CachedImage>, ImageError> {
        let meta = std::fs::metadata(path).map_err(|source| ImageError::Read { path: path.to_path_buf(), source })?;
        let key = (meta.dev(), meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec());
        if let Some(hit) = self.map.lock().unwrap().get(&(path.to_path_buf(), key)) {
            return Ok(hit.clone());
        }
        let image = Image::from_file(path).map_err(|source| ImageError::Invalid { path: path.to_path_buf(), source })?;
        let fd = memfd_create("wisp-image", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).map_err(ImageError::Memfd)?;
        let mut f = File::from(fd);
        f.write_all(&image.bytes).map_err(ImageError::MemfdWrite)?;
        let fd = OwnedFd::from(f);
        fcntl_add_seals(fd.as_fd(), SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL)
            .map_err(ImageError::MemfdSeal)?;
        let entry = Arc::new(CachedImage { image, memfd: fd });
        self.map.lock().unwrap().insert((path.to_path_buf(), key), entry.clone());
        Ok(entry)
    }
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
        let e = ImageCache::default().get(&dir.join("app")).err().unwrap();
        assert!(e.to_string().starts_with(&format!("{}: ", dir.join("app").display())), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
