//! `libhello [N]`: calls `hello_greet` of the shared library `hello`
//! (`wisp run --lib build/libs/hello.so libhello`) N times (default 3) and
//! prints what it wrote, then the library's version and its call counter
//! read where the library keeps it. Exits 127 if the VM was not given the
//! library. `libhello N wait`: then sleeps an hour (for a look at it).
//! `libhello N watch`: then calls it every 2 ms until a live update
//! (`wisp update VM build/libs/hello2.so --replace hello`) changes its
//! version, says what it sees then (the counter carried over, the pointer
//! to it moved, how long the switch held the VM), and exits.
//! `libhello fork`: calls it, forks, and the child and then the parent
//! call it again: each goes on from the counter as it was at the fork
//! (the child's library data is a copy-on-write copy of its parent's).
//! `libhello poke`: writes to the library's code, which the
//! monitor maps read-only and executable: the VM stops with a page fault.
#![no_std]
#![no_main]

// It names the library it uses (optional: without it, its first call
// says which is missing), and takes it only signed with the repository's
// test key, at version 1.0.0 or newer, named, or by a live update.
wisp::main!(
    main,
    wisp::Manifest::new().features(wisp::features::FORK | wisp::features::FAMILY).device(wisp::abi::DeviceKind::Library, "hello", false)
);
wisp::lib_policy!(wisp::LibPolicy::new()
    .key("ea4a6c63e29c520abef5507b132ec5f9954776aebebe7b92421eea691446d22c")
    .min_version(1, 0, 0)
    .loaders(wisp::loader::NAMED | wisp::loader::UPDATE));

wisp::lib_fn!(hello, fn hello_greet(buf: *mut u8, cap: usize) -> usize);
wisp::lib_fn!(hello, fn hello_version() -> u32);
wisp::lib_var!(hello, hello_calls: u64);
wisp::lib_var!(hello, hello_where: *mut u64);

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
    if wisp::env::arg(1) == Some("fork") {
        return fork();
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
    // SAFETY: hello_calls is the library's u64 counter, mapped read-write.
    wisp::println!("libhello: the library counted {} calls", unsafe { core::ptr::read_volatile(hello_calls()) });
    match wisp::env::arg(2) {
        Some("wait") => wisp::time::sleep(core::time::Duration::from_secs(3600)),
        Some("watch") => return watch(n as u64, &mut buf),
        _ => {}
    }
    0
}

/// Call the library until its version changes, then say what the update
/// carried over.
fn watch(mut calls: u64, buf: &mut [u8]) -> i32 {
    // SAFETY: as above.
    let first = unsafe { hello_version() };
    wisp::println!("libhello: watching version {}", first);
    loop {
        wisp::time::sleep(core::time::Duration::from_millis(2));
        // SAFETY: as above.
        unsafe { hello_greet(buf.as_mut_ptr(), buf.len()) };
        calls += 1;
        // SAFETY: as above.
        let v = unsafe { hello_version() };
        if v != first {
            // SAFETY: as above (the new library's greeting).
            let len = unsafe { hello_greet(buf.as_mut_ptr(), buf.len()) };
            calls += 1;
            // SAFETY: the library's counter and its pointer, read where the
            // new library keeps them.
            let (counted, at) = unsafe { (core::ptr::read_volatile(hello_calls()), core::ptr::read_volatile(hello_where())) };
            wisp::print!("{}", core::str::from_utf8(&buf[..len.min(buf.len())]).unwrap_or("(not UTF-8)\n"));
            wisp::println!(
                "libhello: now version {} after {} calls; the library counted {}; its pointer {}; the switch held the VM {} us",
                v,
                calls,
                counted,
                if at == hello_calls() { "follows the counter" } else { "was left behind" },
                wisp::lib::last_switch_ns() / 1000
            );
            return 0;
        }
    }
}

/// A call before the fork, one in the child, one in the parent after it.
fn fork() -> i32 {
    let mut buf = [0u8; 64];
    let mut greet = |who: &str| {
        // SAFETY: as in `main`.
        let len = unsafe { hello_greet(buf.as_mut_ptr(), buf.len()) };
        wisp::print!("{}: {}", who, core::str::from_utf8(&buf[..len.min(buf.len())]).unwrap_or("(not UTF-8)\n"));
    };
    greet("before the fork");
    match wisp::family::fork() {
        Ok(0) => {
            greet("child");
            0
        }
        Ok(_) => {
            let status = wisp::family::wait().map(|(_, s)| s).unwrap_or(u64::MAX);
            greet("parent");
            if status == 0 { 0 } else { 1 }
        }
        Err(e) => {
            wisp::eprintln!("libhello: fork: {:?}", e);
            1
        }
    }
}
