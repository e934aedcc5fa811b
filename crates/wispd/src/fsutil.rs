//! Files in the daemon's state directory.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// Write a file atomically (temporary file, then rename). Not fsynced:
/// state must survive a crash of the daemon or a VMM process, not of the
/// host (the state directory lives in /run).
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(data)?;
    std::fs::rename(&tmp, path)
}
