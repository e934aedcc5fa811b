//! The files a jailed process may still write: opened before the jail
//! closes (it has no `open` afterwards), committed by a rename relative to
//! the directory's descriptor.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{openat, renameat, Mode, OFlags, CWD};

/// Files a jailed VMM process may write, opened before the jail closes.
pub struct JailFiles {
    dir: OwnedFd,
    /// `exit.json.tmp`.
    pub exit_tmp: File,
    /// `console.log.tmp`.
    pub console_tmp: File,
}

impl JailFiles {
    /// Open the VM directory and the temporary files in it (never through
    /// a link: this runs as root, before the jail closes).
    pub fn open(dir: &Path) -> std::io::Result<JailFiles> {
        let dir = openat(CWD, dir, OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
        let tmp = |name: &str| -> std::io::Result<File> {
            let flags = OFlags::CREATE | OFlags::TRUNC | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let fd = openat(&dir, name, flags, Mode::from_raw_mode(0o644))?;
            Ok(File::from(fd))
        };
        Ok(JailFiles { exit_tmp: tmp("exit.json.tmp")?, console_tmp: tmp("console.log.tmp")?, dir })
    }

    /// The same from descriptors opened by someone else (the daemon, for a
    /// forked VM).
    pub fn from_fds(dir: OwnedFd, exit_tmp: File, console_tmp: File) -> JailFiles {
        JailFiles { dir, exit_tmp, console_tmp }
    }

    /// The directory and the two files, as descriptors.
    pub fn into_parts(self) -> (OwnedFd, File, File) {
        (self.dir, self.exit_tmp, self.console_tmp)
    }

    /// Rename `<name>.tmp` to `<name>` inside the VM directory.
    pub fn commit(&self, name: &str) -> std::io::Result<()> {
        Ok(renameat(self.dir.as_fd(), format!("{name}.tmp"), self.dir.as_fd(), name)?)
    }
}
