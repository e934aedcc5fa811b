//! What an application built as a guest shared library links against
//! (issue 17, recycling; `docs/libraries.md`): a library links against
//! nothing, so its arguments, output and clocks come from its loader as
//! the function pointers of `wisp_abi::app::AppSys`, wrapped here. Also
//! the calendar (`civil`), which the library OS shares.
//!
//! ```ignore
//! fn main(app: &wisp_app::App) -> i32 {
//!     wisp_app::println!(app, "hello, {}", app.arg(1).unwrap_or("you"));
//!     0
//! }
//! wisp_app::entry!(main);
//! ```
#![cfg_attr(not(test), no_std)]

use core::fmt;

pub use wisp_abi::app::{AppSys, APP_ABI};

/// An application's view of its loader.
pub struct App<'a> {
    sys: &'a AppSys,
}

impl<'a> App<'a> {
    /// The app that `sys` was handed to, if its loader speaks this ABI.
    ///
    /// # Safety
    /// `sys` is the pointer the loader passed the entry: valid for the
    /// call, its `args` valid for `args_len` bytes.
    pub unsafe fn new(sys: *const AppSys) -> Option<App<'a>> {
        // SAFETY: the caller's.
        let sys = unsafe { sys.as_ref()? };
        (sys.version == APP_ABI).then_some(App { sys })
    }

    /// The arguments (argument 0 is the app's name).
    pub fn args(&self) -> impl Iterator<Item = &'a str> {
        // SAFETY: `args_len` bytes at `args` (`App::new`'s contract).
        let bytes: &'a [u8] = if self.sys.args.is_null() { &[] } else { unsafe { core::slice::from_raw_parts(self.sys.args, self.sys.args_len) } };
        bytes.split(|&b| b == 0).take(self.sys.argc as usize).map(|a| core::str::from_utf8(a).unwrap_or(""))
    }

    /// Argument `n`.
    pub fn arg(&self, n: usize) -> Option<&'a str> {
        self.args().nth(n)
    }

    /// Write to standard output (1) or standard error (2).
    pub fn write(&self, fd: u32, data: &[u8]) -> isize {
        (self.sys.write)(fd, data.as_ptr(), data.len())
    }

    /// Write formatted text to standard output.
    pub fn print(&self, args: fmt::Arguments) {
        let mut out = Out::new(self, 1);
        let _ = fmt::write(&mut out, args);
        out.flush();
    }

    /// Write formatted text to standard error.
    pub fn eprint(&self, args: fmt::Arguments) {
        let mut out = Out::new(self, 2);
        let _ = fmt::write(&mut out, args);
        out.flush();
    }

    /// Nanoseconds since the app was started.
    pub fn uptime_ns(&self) -> u64 {
        (self.sys.uptime_ns)()
    }

    /// Nanoseconds since the Unix epoch.
    pub fn wall_ns(&self) -> u64 {
        (self.sys.wall_ns)()
    }

    /// Bytes of the VM's RAM.
    pub fn mem_size(&self) -> u64 {
        self.sys.mem_size
    }
}

/// Formatted text gathered into one write per print (each write is a call
/// into the loader, and the recycler's a hypercall: as the library OS's
/// own `print!` does).
struct Out<'a, 'b> {
    app: &'a App<'b>,
    fd: u32,
    buf: [u8; 512],
    len: usize,
    failed: bool,
}

impl<'a, 'b> Out<'a, 'b> {
    fn new(app: &'a App<'b>, fd: u32) -> Self {
        Out { app, fd, buf: [0; 512], len: 0, failed: false }
    }

    fn flush(&mut self) {
        if self.len > 0 && self.app.write(self.fd, &self.buf[..self.len]) < 0 {
            self.failed = true;
        }
        self.len = 0;
    }
}

impl fmt::Write for Out<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut b = s.as_bytes();
        while !b.is_empty() {
            if self.len == self.buf.len() {
                self.flush();
            }
            let n = b.len().min(self.buf.len() - self.len);
            self.buf[self.len..self.len + n].copy_from_slice(&b[..n]);
            self.len += n;
            b = &b[n..];
        }
        if self.failed {
            return Err(fmt::Error);
        }
        Ok(())
    }
}

/// `print!` to an app's standard output.
#[macro_export]
macro_rules! print {
    ($app:expr, $($arg:tt)*) => { $app.print(format_args!($($arg)*)) };
}

/// `print!` to an app's standard error.
#[macro_export]
macro_rules! eprint {
    ($app:expr, $($arg:tt)*) => { $app.eprint(format_args!($($arg)*)) };
}

/// `println!` to an app's standard output.
#[macro_export]
macro_rules! println {
    ($app:expr) => { $app.print(format_args!("\n")) };
    ($app:expr, $($arg:tt)*) => { $app.print(format_args!("{}\n", format_args!($($arg)*))) };
}

/// Export `$main` (`fn(&App) -> i32`) as the library's entry
/// (`wisp_abi::app::APP_ENTRY`). A loader of another ABI version gets
/// exit status 126.
#[macro_export]
macro_rules! entry {
    ($main:path) => {
        #[no_mangle]
        pub extern "C" fn wisp_app_main(sys: *const $crate::AppSys) -> i32 {
            // SAFETY: `sys` is what the loader passed this entry.
            match unsafe { $crate::App::new(sys) } {
                Some(app) => $main(&app),
                None => 126,
            }
        }
    };
}

/// Civil date and time (UTC) from nanoseconds since the epoch:
/// (year, month, day, hour, minute, second).
pub fn civil(ns: u64) -> (i64, u32, u32, u32, u32, u32) {
    let secs = (ns / 1_000_000_000) as i64;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = if m <= 2 { y + 1 } else { y };
    (y, m, d, (sod / 3600) as u32, (sod / 60 % 60) as u32, (sod % 60) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn write(_fd: u32, _d: *const u8, len: usize) -> isize {
        len as isize
    }
    extern "C" fn zero() -> u64 {
        0
    }

    #[test]
    fn args_are_read_as_the_loader_laid_them_out() {
        let raw = b"hello\0a\0b\0";
        let sys = AppSys { version: APP_ABI, argc: 3, args: raw.as_ptr(), args_len: raw.len(), mem_size: 16 << 20, write, uptime_ns: zero, wall_ns: zero };
        // SAFETY: `sys` and `raw` outlive `app`.
        let app = unsafe { App::new(&sys) }.unwrap();
        assert_eq!(app.args().collect::<Vec<_>>(), ["hello", "a", "b"]);
        assert_eq!(app.arg(2), Some("b"));
        let other = AppSys { version: APP_ABI + 1, ..sys };
        // SAFETY: as above.
        assert!(unsafe { App::new(&other) }.is_none(), "another ABI version");
    }

    std::thread_local! {
        static WRITES: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    extern "C" fn record(_fd: u32, d: *const u8, len: usize) -> isize {
        // SAFETY: the caller's buffer of `len` bytes.
        let bytes = unsafe { std::slice::from_raw_parts(d, len) }.to_vec();
        WRITES.with(|w| w.borrow_mut().push(bytes));
        len as isize
    }

    #[test]
    fn a_print_is_one_write_until_its_buffer_fills() {
        let sys = AppSys { version: APP_ABI, argc: 0, args: std::ptr::null(), args_len: 0, mem_size: 0, write: record, uptime_ns: zero, wall_ns: zero };
        // SAFETY: `sys` outlives `app`.
        let app = unsafe { App::new(&sys) }.unwrap();
        crate::println!(app, "a {} b {} c {}", 1, "two", 3.5);
        let long = "x".repeat(1000);
        crate::print!(app, "{long}{}", "!");
        let w = WRITES.with(|w| w.take());
        assert_eq!(w[0], b"a 1 b two c 3.5\n");
        assert_eq!(w.len(), 1 + 2, "{:?}", w.iter().map(Vec::len).collect::<Vec<_>>());
        assert_eq!(w[1..].concat(), format!("{long}!").into_bytes());
    }

    #[test]
    fn the_calendar() {
        assert_eq!(civil(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(civil(951_782_400_000_000_000), (2000, 2, 29, 0, 0, 0));
        assert_eq!(civil(1_795_000_000_000_000_000), (2026, 11, 18, 11, 6, 40));
    }
}
