//! Files in the daemon's state directory: the daemon's own, written
//! atomically into directories only root can write, and the ones VMM
//! processes leave in their directories, read back as untrusted input
//! (never following a link, never blocking, never more than a cap).

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// `bytes` in a new memfd named `name`, sealed against every change: what
/// VMM processes map is what the daemon checked.
pub fn sealed_memfd(name: &str, bytes: &[u8]) -> io::Result<std::os::fd::OwnedFd> {
    use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};
    let mut f = File::from(memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?);
    f.write_all(bytes)?;
    let fd = std::os::fd::OwnedFd::from(f);
    fcntl_add_seals(&fd, SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL)?;
    Ok(fd)
}

/// Write a file atomically (a temporary file of our own next to it, then
/// rename), mode 0600. The temporary file is created exclusively and never
/// through a link. Not fsynced: state must survive a crash of the daemon or
/// a VMM process, not of the host (the state directory lives in /run).
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.{}.tmp", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let tmp = path.with_file_name(tmp_name);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let done = f.write_all(data).and_then(|()| fs::rename(&tmp, path));
    if done.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    done
}

/// Largest file [`rewrite`] writes in place: one page, which a single
/// `pwrite` at offset 0 fills in the page cache in one step (the kernel
/// checks for a fatal signal only between pages), so a daemon killed
/// during it leaves the old bytes or the new ones, never a mix.
pub const IN_PLACE_MAX: usize = 4096;

/// Write `data` over the file at `path`, which the daemon wrote before
/// ([`write_atomic`]): in place, with one `pwrite` padded with spaces to the
/// old length (JSON readers skip trailing whitespace), when old and new fit
/// in [`IN_PLACE_MAX`] bytes; else (no file yet, or larger) atomically.
/// About 10 µs against ~200 µs for a new file and a rename on ext4: this is
/// on the path of every create.
pub fn rewrite(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    if data.len() <= IN_PLACE_MAX {
        let f = fs::OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path);
        if let Ok(f) = f {
            let meta = f.metadata()?;
            let old = meta.len() as usize;
            if meta.is_file() && meta.mode() & 0o777 == 0o600 && old <= IN_PLACE_MAX {
                let mut buf = data.to_vec();
                buf.resize(old.max(data.len()), b' ');
                if f.write_at(&buf, 0)? == buf.len() {
                    return Ok(());
                }
            }
        }
    }
    write_atomic(path, data)
}

/// Make `dir` (and its parents) a directory private to the daemon: owned by
/// the daemon's user, mode 0700, not a link. An existing one that someone
/// else owns is refused.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = fs::symlink_metadata(dir)?;
    if !m.file_type().is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", dir.display())));
    }
    let me = rustix::process::geteuid().as_raw();
    if m.uid() != me {
        return Err(io::Error::other(format!("{} is owned by uid {}, not the daemon's {me}", dir.display(), m.uid())));
    }
    if m.mode() & 0o7777 != 0o700 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Why an untrusted file was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// It could not be opened or read (it may not exist).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// A link, directory, FIFO or device where a file should be.
    #[error("not a regular file")]
    NotAFile,
    /// Larger than the cap.
    #[error("larger than {0} bytes")]
    TooLarge(u64),
}

/// Open `path` for reading without following a link or blocking on a FIFO,
/// and check that it is a regular file.
fn open_untrusted(path: &Path) -> Result<(File, u64), ReadError> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| if e.raw_os_error() == Some(libc::ELOOP) { ReadError::NotAFile } else { ReadError::Io(e) })?;
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(ReadError::NotAFile);
    }
    Ok((f, m.len()))
}

/// Read a whole file someone else may have written (a VMM process, or a
/// state directory of unknown origin): a regular file, not a link, at most
/// `max` bytes.
pub fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let (f, _) = open_untrusted(path)?;
    let mut v = Vec::new();
    f.take(max + 1).read_to_end(&mut v)?;
    if v.len() as u64 > max {
        return Err(ReadError::TooLarge(max));
    }
    Ok(v)
}

/// The last `max` bytes (at most) of a file someone else may have written.
pub fn read_tail(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let (mut f, len) = open_untrusted(path)?;
    if len > max {
        f.seek(SeekFrom::Start(len - max))?;
    }
    let mut v = Vec::new();
    f.take(max).read_to_end(&mut v)?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("wispd-fsutil-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn untrusted_files_are_capped_and_never_followed() {
        let d = scratch("read");
        fs::write(d.join("small"), b"{}").unwrap();
        assert_eq!(read_capped(&d.join("small"), 2).unwrap(), b"{}");
        fs::write(d.join("big"), vec![b'x'; 100]).unwrap();
        assert!(matches!(read_capped(&d.join("big"), 99), Err(ReadError::TooLarge(99))));
        assert_eq!(read_tail(&d.join("big"), 10).unwrap(), vec![b'x'; 10]);
        assert_eq!(read_tail(&d.join("small"), 10).unwrap(), b"{}");
        std::os::unix::fs::symlink("/etc/hostname", d.join("link")).unwrap();
        assert!(matches!(read_capped(&d.join("link"), 1 << 20), Err(ReadError::NotAFile)));
        assert!(matches!(read_capped(&d, 1 << 20), Err(ReadError::NotAFile)));
        // A FIFO neither blocks the reader nor counts as a file.
        let fifo = d.join("fifo");
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, rustix::fs::Mode::from_raw_mode(0o600), 0).unwrap();
        assert!(matches!(read_capped(&fifo, 10), Err(ReadError::NotAFile)));
        assert!(matches!(read_capped(&d.join("missing"), 10), Err(ReadError::Io(_))));
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn atomic_writes_replace_and_leave_no_temporary_files() {
        let d = scratch("write");
        write_atomic(&d.join("r.json"), b"one").unwrap();
        write_atomic(&d.join("r.json"), b"two").unwrap();
        assert_eq!(fs::read(d.join("r.json")).unwrap(), b"two");
        // Rewritten in place: shorter is padded, longer grows the file.
        rewrite(&d.join("r.json"), b"[1]").unwrap();
        assert_eq!(fs::read(d.join("r.json")).unwrap(), b"[1]");
        rewrite(&d.join("r.json"), b"[12345]").unwrap();
        rewrite(&d.join("r.json"), b"[6]").unwrap();
        assert_eq!(fs::read(d.join("r.json")).unwrap(), b"[6]    ");
        assert_eq!(serde_json::from_slice::<Vec<u32>>(&fs::read(d.join("r.json")).unwrap()).unwrap(), vec![6]);
        // Over a page, or no file yet: written atomically (exact length, no temporary left).
        let big = vec![b'7'; IN_PLACE_MAX + 1];
        rewrite(&d.join("r.json"), &big).unwrap();
        assert_eq!(fs::read(d.join("r.json")).unwrap(), big);
        rewrite(&d.join("r.json"), b"[8]").unwrap();
        assert_eq!(fs::read(d.join("r.json")).unwrap(), b"[8]", "a large file is replaced whole");
        rewrite(&d.join("new.json"), b"[9]").unwrap();
        assert_eq!(fs::metadata(d.join("new.json")).unwrap().mode() & 0o777, 0o600);
        fs::remove_file(d.join("new.json")).unwrap();
        assert_eq!(fs::metadata(d.join("r.json")).unwrap().mode() & 0o777, 0o600);
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
        private_dir(&d.join("meta")).unwrap();
        assert_eq!(fs::metadata(d.join("meta")).unwrap().mode() & 0o7777, 0o700);
        fs::set_permissions(d.join("meta"), fs::Permissions::from_mode(0o777)).unwrap();
        private_dir(&d.join("meta")).unwrap();
        assert_eq!(fs::metadata(d.join("meta")).unwrap().mode() & 0o7777, 0o700);
        std::os::unix::fs::symlink(d.join("meta"), d.join("meta2")).unwrap();
        assert!(private_dir(&d.join("meta2")).is_err(), "a link is not a private directory");
        let _ = fs::remove_dir_all(&d);
    }
}
