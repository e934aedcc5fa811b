//! `bigstatic`: the statically linked peer of `bench.so` in `make
//! bench-libs` (`bench/libs.py`): the same 1 MiB table of constants, linked
//! into the image, every page read; then it says so and sleeps.
#![no_std]
#![no_main]

wisp::main!(main);

/// Bytes of the table (as `bench.so`'s `bench_table`).
const TABLE_BYTES: usize = 1 << 20;
static TABLE: [u8; TABLE_BYTES] = [0x5a; TABLE_BYTES];

fn main() -> i32 {
    let mut sum = 0u64;
    for at in (0..TABLE_BYTES).step_by(4096) {
        // SAFETY: in the table; volatile so every page is read.
        sum += unsafe { core::ptr::read_volatile(&TABLE[at]) } as u64;
    }
    wisp::println!("bigstatic: touched the table ({})", sum);
    wisp::time::sleep(core::time::Duration::from_secs(86400));
    0
}
