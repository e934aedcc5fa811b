//! `hello`: prints its arguments and the time since boot.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec::Vec;

wisp::main!(main);

fn main() -> i32 {
    let up = wisp::time::uptime();
    let args: Vec<&str> = wisp::env::args().skip(1).collect();
    let (y, mo, d, h, mi, s) = wisp::time::civil(wisp::time::wall_ns());
    wisp::println!("Hello from wisp! args: {:?}", args);
    wisp::println!(
        "booted {}.{:03} ms ago, {} MiB RAM, wall clock {:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        up.as_micros() / 1000,
        up.as_micros() % 1000,
        wisp::env::mem_size() >> 20,
        y,
        mo,
        d,
        h,
        mi,
        s
    );
    0
}
