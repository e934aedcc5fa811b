//! `libhello [N]`: calls `hello_greet` of the shared library `hello`
//! (`wisp run --lib build/libs/hello.so libhello`) N times (default 3) and
//! prints what it wrote, then the library's version and its call counter
//! read where the library keeps it. Exits 127 if the VM was not given the
//! library. `libhello N wait`: then sleeps an hour (for a look at it).
//! `libhello poke`: writes to the library's code, which the
//! monitor maps read-only and executable: the VM stops with a page fault.
#![no_std]
#![no_main]

wisp::main!(main);

wisp::lib_fn!(hello, fn hello_greet(buf: *mut u8, cap: usize) -> usize);
wisp::lib_fn!(hello, fn hello_version() -> u32);

fn main() -> i32 {
    if wisp::env::arg(1) == Some("poke") {
        let at = wisp::lib::open("hello").and_then(|l| l.symbol("hello_greet")).expect("hello_greet");
        wisp::println!("libhello: writing to the library's code at {:#x}", at);
        // SAFETY: not safe, on purpose: the page is read-only for the
        // guest, and the write must fault.
        unsafe { core::ptr::write_volatile(at as *mut u8, 0xcc) };
        wisp::println!("libhello: the write went through");
        return 1;
    }
    let n = wisp::env::arg(1).and_then(|a| a.parse::<u32>().ok()).unwrap_or(3);
    let mut buf = [0u8; 64];
    for _ in 0..n {
        // SAFETY: hello.so's hello_greet writes at most `cap` bytes.
        let len = unsafe { hello_greet(buf.as_mut_ptr(), buf.len()) };
        wisp::print!("{}", core::str::from_utf8(&buf[..len.min(buf.len())]).unwrap_or("(not UTF-8)\n"));
    }
    // SAFETY: hello_version takes nothing and returns a number.
    wisp::println!("libhello: version {}", unsafe { hello_version() });
    let lib = wisp::lib::open("hello").expect("given the library");
    let calls = lib.symbol("hello_calls").expect("hello_calls");
    // SAFETY: hello_calls is the library's u64 counter, mapped read-write.
    wisp::println!("libhello: the library counted {} calls", unsafe { core::ptr::read_volatile(calls as *const u64) });
    if wisp::env::arg(2) == Some("wait") {
        wisp::time::sleep(core::time::Duration::from_secs(3600));
    }
    0
}
