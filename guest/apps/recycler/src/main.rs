//! `recycler APP [ARGS...]`: runs an application built as a shared library
//! (`wisp run --recycle build/libs/APP.so -- ARGS`, which boots this image
//! with the library and its name): finds the library the VM was given
//! under that name, and calls its entry (`wisp_abi::app::APP_ENTRY`) with
//! the services it may use (`wisp_abi::app::AppSys`: the arguments after
//! this image's own name, output, clocks). Its return is the VM's exit
//! status. Issue 17, recycling: this is the VM an app is loaded into. It
//! says it is ready before it reads its arguments: wispd's recycling
//! groups keep it booted there, write each run's arguments, let it go on,
//! and scrub it back to that point after the app exits
//! (`docs/libraries.md`, "Recycling"); elsewhere the call does nothing.
#![no_std]
#![no_main]

use core::sync::atomic::{AtomicU64, Ordering};

use wisp::abi::app::{AppSys, APP_ABI, APP_ENTRY};

wisp::main!(main, wisp::Manifest::new().features(wisp::features::READY));

extern crate alloc;

/// Bytes of heap each run takes fresh and fills (see `main`).
const FRESH_BYTES: usize = 64 << 10;

/// Runs of this VM since its ready point (always 1 when it is scrubbed).
static RUNS: AtomicU64 = AtomicU64::new(0);

/// The guest's clock when the app was started.
static STARTED_NS: AtomicU64 = AtomicU64::new(0);

extern "C" fn app_write(fd: u32, data: *const u8, len: usize) -> isize {
    let out: fn(&[u8]) = match fd {
        1 => wisp::console::write_bytes,
        2 => wisp::console::write_err,
        _ => return wisp::abi::errno::EBADF as isize,
    };
    // SAFETY: the app's own buffer, `len` bytes (its side of the contract).
    let bytes = unsafe { core::slice::from_raw_parts(data, len) };
    // Through a buffer in RAM: the monitor takes console bytes from guest
    // RAM only, and the app's own (its constants) are in the library window.
    let mut buf = [0u8; 512];
    for chunk in bytes.chunks(buf.len()) {
        buf[..chunk.len()].copy_from_slice(chunk);
        out(&buf[..chunk.len()]);
    }
    len as isize
}

extern "C" fn app_uptime_ns() -> u64 {
    wisp::time::monotonic_ns().saturating_sub(STARTED_NS.load(Ordering::Relaxed))
}

extern "C" fn app_wall_ns() -> u64 {
    wisp::time::wall_ns()
}

fn main() -> i32 {
    // The ready point: everything after it is one run's.
    if let Err(e) = wisp::ready() {
        wisp::eprintln!("recycler: ready: error {}", e);
        return 125;
    }
    // A recycled VM is scrubbed back to the ready point after each run:
    // this VM's memory must not remember an earlier one.
    if RUNS.fetch_add(1, Ordering::Relaxed) != 0 {
        wisp::eprintln!("recycler: this VM's memory kept an earlier run");
        return 3;
    }
    let Some(name) = wisp::env::arg(1) else {
        wisp::eprintln!("recycler: usage: recycler APP [ARGS...] (wisp run --recycle APP.so -- ARGS)");
        return 2;
    };
    let Some(lib) = wisp::lib::open(name) else {
        wisp::eprintln!("recycler: the VM was given no library {} (wisp run --recycle {}.so)", name, name);
        return 127;
    };
    let Some(entry) = lib.symbol(APP_ENTRY) else {
        wisp::eprintln!("recycler: library {} has no {}: not an application", name, APP_ENTRY);
        return 127;
    };
    // The app's arguments: this image's, from its name on (argument 0).
    let info = wisp::env::boot_info();
    let args = &info.args[..(info.args_len as usize).min(info.args.len())];
    let skip = args.iter().position(|&b| b == 0).map_or(args.len(), |i| i + 1);
    let sys = AppSys {
        version: APP_ABI,
        argc: info.argc.saturating_sub(1),
        args: args[skip..].as_ptr(),
        args_len: args.len() - skip,
        mem_size: wisp::env::mem_size(),
        write: app_write,
        uptime_ns: app_uptime_ns,
        wall_ns: app_wall_ns,
    };
    STARTED_NS.store(wisp::time::monotonic_ns(), Ordering::Relaxed);
    // SAFETY: the library's export of that name is its entry (checked by
    // nothing but its name: an application library's contract).
    let f: extern "C" fn(*const AppSys) -> i32 = unsafe { core::mem::transmute(entry) };
    // A library call: no live update switches it out from under the app.
    wisp::lib::enter();
    let code = f(&sys);
    wisp::lib::leave();
    // So must the heap pages first handed out after the ready point: the
    // allocator takes pages it never handed out for zeros (they are, in a
    // new VM), and an earlier run wrote these. (Checked after the app, off
    // the path to its first output.)
    let mut fresh = alloc::vec![0u8; FRESH_BYTES];
    if fresh.iter().any(|&b| b != 0) {
        wisp::eprintln!("recycler: this VM's heap kept an earlier run");
        return 3;
    }
    fresh.fill(0xa5);
    core::hint::black_box(&fresh);
    code
}
