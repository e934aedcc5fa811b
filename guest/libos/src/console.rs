//! Console output: `print!` and `println!` (standard output), `eprint!`
//! and `eprintln!` (standard error) format into a small buffer and write
//! it with one hypercall per call (and per 512 bytes).

use core::fmt::{self, Write};

struct Buffered {
    buf: [u8; 512],
    len: usize,
    err: bool,
}

impl Buffered {
    fn flush(&mut self) {
        if self.len > 0 {
            if self.err {
                write_err(&self.buf[..self.len]);
            } else {
                crate::hypercall::console_write(&self.buf[..self.len]);
            }
            self.len = 0;
        }
    }
}

impl Write for Buffered {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for chunk in s.as_bytes().chunks(self.buf.len()) {
            if self.len + chunk.len() > self.buf.len() {
                self.flush();
            }
            self.buf[self.len..self.len + chunk.len()].copy_from_slice(chunk);
            self.len += chunk.len();
        }
        Ok(())
    }
}

/// Write formatted text to the console (used by the macros).
pub fn print_fmt(args: fmt::Arguments) {
    let mut b = Buffered { buf: [0; 512], len: 0, err: false };
    let _ = b.write_fmt(args);
    b.flush();
}

/// Write formatted text to standard error (used by the macros).
pub fn eprint_fmt(args: fmt::Arguments) {
    let mut b = Buffered { buf: [0; 512], len: 0, err: true };
    let _ = b.write_fmt(args);
    b.flush();
}

/// Write raw bytes to standard error (on a monitor without it, which
/// answers `ENOSYS`, to the console).
pub fn write_err(data: &[u8]) {
    for chunk in data.chunks(wisp_abi::args::CONSOLE_WRITE_MAX as usize) {
        let r = crate::hypercall::stdio(wisp_abi::args::stdio_op::WRITE_ERR, chunk.as_ptr() as *mut u8, chunk.len());
        if r == wisp_abi::errno::ENOSYS {
            crate::hypercall::console_write(chunk);
        }
    }
}

/// Write raw bytes to the console.
pub fn write_bytes(data: &[u8]) {
    for chunk in data.chunks(wisp_abi::args::CONSOLE_WRITE_MAX as usize) {
        crate::hypercall::console_write(chunk);
    }
}

/// Print to the console.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => { $crate::console::print_fmt(format_args!($($arg)*)) };
}

/// Print a line to the console.
#[macro_export]
macro_rules! println {
    () => { $crate::console::print_fmt(format_args!("\n")) };
    ($fmt:literal $($arg:tt)*) => { $crate::console::print_fmt(format_args!(concat!($fmt, "\n") $($arg)*)) };
}

/// Print to standard error (`wisp run` shows it on its stderr, `wisp
/// logs --stderr` apart from standard output).
#[macro_export]
macro_rules! eprint {
    ($($arg:tt)*) => { $crate::console::eprint_fmt(format_args!($($arg)*)) };
}

/// Print a line to standard error.
#[macro_export]
macro_rules! eprintln {
    () => { $crate::console::eprint_fmt(format_args!("\n")) };
    ($fmt:literal $($arg:tt)*) => { $crate::console::eprint_fmt(format_args!(concat!($fmt, "\n") $($arg)*)) };
}
