//! What every version of `hello.so` is: a greeting (each version's own,
//! `super::GREETING`), its version number (`super::VERSION`), a counter and
//! a pointer to it. Shared by `guest/libs/hello` and `guest/libs/hello2`.

/// Calls so far (state a live update of the library carries over).
#[no_mangle]
pub static mut hello_calls: u64 = 0;

/// Where the counter is: a pointer into the library's own data, which a
/// live update moves to the new library's counter.
#[no_mangle]
pub static mut hello_where: *mut u64 = &raw mut hello_calls;

/// Write "hello from hello.so (call N)\n" into `buf` (`cap` bytes); the
/// bytes written (cut at `cap`).
///
/// # Safety
/// `buf` points to `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn hello_greet(buf: *mut u8, cap: usize) -> usize {
    // SAFETY: the library's own counter; guests call it from one thread.
    let n = unsafe {
        hello_calls += 1;
        hello_calls
    };
    let mut w = Writer { buf, cap, len: 0 };
    w.put(super::GREETING);
    w.num(n);
    w.put(b")\n");
    w.len
}

/// The library's version, as a number (major * 10000 + minor * 100 + patch).
#[no_mangle]
pub extern "C" fn hello_version() -> u32 {
    super::VERSION
}

struct Writer {
    buf: *mut u8,
    cap: usize,
    len: usize,
}

impl Writer {
    fn put(&mut self, s: &[u8]) {
        for &b in s {
            if self.len < self.cap {
                // SAFETY: within the `cap` bytes the caller gave.
                unsafe { self.buf.add(self.len).write(b) };
                self.len += 1;
            }
        }
    }

    fn num(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.put(&digits[i..]);
    }
}

/// The library as an application (loaded by the `recycler` image: `wisp
/// run --recycle build/libs/hello.so -- a b`): prints as the `hello`
/// image does — its arguments, the time since it was started, the VM's
/// RAM and the wall clock.
///
/// A VM that runs it again must have been scrubbed in between (recycling):
/// finding the counter of an earlier run, it says so and exits 3.
fn app_main(app: &wisp_app::App) -> i32 {
    // SAFETY: the library's own counter; the app runs on the one vCPU.
    let runs = unsafe {
        hello_calls += 1;
        hello_calls
    };
    if runs != 1 {
        wisp_app::eprint!(app, "hello.so: this VM kept the state of {} earlier run(s)\n", runs - 1);
        return 3;
    }
    let (y, mo, d, h, mi, s) = wisp_app::civil(app.wall_ns());
    let up = app.uptime_ns() / 1000;
    wisp_app::println!(app, "Hello from wisp! args: [{}]", Quoted(app));
    wisp_app::println!(
        app,
        "booted {}.{:03} ms ago, {} MiB RAM, wall clock {:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        up / 1000,
        up % 1000,
        app.mem_size() >> 20,
        y,
        mo,
        d,
        h,
        mi,
        s
    );
    0
}

wisp_app::entry!(app_main);

/// The arguments after the app's name, as `{:?}` of a list shows them.
struct Quoted<'a, 'b>(&'a wisp_app::App<'b>);

impl core::fmt::Display for Quoted<'_, '_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (i, a) in self.0.args().skip(1).enumerate() {
            write!(f, "{}{:?}", if i == 0 { "" } else { ", " }, a)?;
        }
        Ok(())
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // A library has no console of its own: stop here (an invalid-opcode
    // fault the monitor reports as the guest's).
    // SAFETY: ud2 only raises #UD.
    unsafe { core::arch::asm!("ud2", options(noreturn)) }
}
