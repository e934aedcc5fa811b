//! @NAME@: a wisp app. Build and boot it with `wisp run .` (or
//! `wisp build`, then `wisp run target/x86_64-unknown-none/release/@NAME@`).
//! The library OS guide: docs/libos.md in the wisp repository.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec::Vec;

wisp::main!(main);

fn main() -> i32 {
    let args: Vec<&str> = wisp::env::args().skip(1).collect();
    wisp::println!("Hello from @NAME@! args: {:?}", args);
    0
}
