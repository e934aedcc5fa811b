//! The console of a VM run in the calling process (`wisp run` without a
//! daemon, `wisp-oci`'s container process): the guest's stdout on ours,
//! its stderr on ours.

use std::io::Write;

pub struct Terminal<'a>(pub std::io::StdoutLock<'a>);

impl Write for Terminal<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.write(data)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl wisp_vmm::Console for Terminal<'_> {
    fn write_err(&mut self, data: &[u8]) -> std::io::Result<()> {
        // What the guest wrote to stdout before goes out first.
        self.0.flush()?;
        std::io::stderr().write_all(data)
    }
}
