//! The console of a VM run in the calling process (`wisp run` without a
//! daemon, `wisp-oci`'s container process): the guest's stdout on ours,
//! its stderr on ours, our stdin fed to it.

use std::io::{Read, Write};

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

/// Feed this process's standard input to the guest from a thread of its
/// own, until its end (the thread is left blocked in a read if the VM ends
/// first: the process is about to end too).
pub fn feed_stdin(feed: wisp_vmm::StdinFeed) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut stdin = std::io::stdin().lock();
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => feed.push(&buf[..n]),
            }
        }
        feed.end();
    });
}
