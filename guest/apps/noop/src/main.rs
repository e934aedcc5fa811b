//! `noop`: exits 0 at once. The boot benchmark's guest.
#![no_std]
#![no_main]

wisp::main!(main);

fn main() -> i32 {
    0
}
