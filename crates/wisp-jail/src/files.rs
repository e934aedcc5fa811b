//! The files a jailed process may still write: opened before the jail
//! closes (it has no `open` afterwards, and no directory descriptor either,
//! so it cannot name any other file: no path lookup is left to it).
//!
//! They are written in place, once, when the VM ends; their reader (the
//! daemon) reads them only after the process has ended, and treats them as
//! untrusted input (a process killed while writing leaves a torn file,
//! which reads as "the VMM process died").

use std::fs::File;
use std::path::Path;

use rustix::fs::{openat, Mode, OFlags, CWD};

/// Files a jailed VMM process may write, opened before the jail closes.
pub struct JailFiles {
    /// `exit.json`: how the VM ended.
    pub exit: File,
    /// `console.log`: the end of its console (standard output).
    pub console: File,
    /// `stderr.log`: the end of its standard error.
    pub errors: File,
}

impl JailFiles {
    /// Create (empty) `exit.json`, `console.log` and `stderr.log` in the VM directory
    /// `dir`, never through a link: this runs as root, before the jail
    /// closes.
    pub fn open(dir: &Path) -> std::io::Result<JailFiles> {
        let dir = openat(CWD, dir, OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
        let file = |name: &str| -> std::io::Result<File> {
            let flags = OFlags::CREATE | OFlags::TRUNC | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            Ok(File::from(openat(&dir, name, flags, Mode::from_raw_mode(0o644))?))
        };
        Ok(JailFiles { exit: file("exit.json")?, console: file("console.log")?, errors: file("stderr.log")? })
    }

    /// The same from descriptors opened by someone else (the daemon, for a
    /// forked VM).
    pub fn from_files(exit: File, console: File, errors: File) -> JailFiles {
        JailFiles { exit, console, errors }
    }

    /// The three files.
    pub fn into_parts(self) -> (File, File, File) {
        (self.exit, self.console, self.errors)
    }
}
