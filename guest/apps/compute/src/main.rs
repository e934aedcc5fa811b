//! `compute [DIGITS]`: a lightweight compute function, as LightVM's compute
//! service ran one (§7.4: an approximation of e): the first DIGITS decimals
//! of e (default 1,000) by the spigot algorithm, integers only, printed on
//! one line. `bench/tools/compute.c` is the same computation as a host
//! process, for the functions service's benchmark (`bench/usecases_fn.py`).
//! (Integers: the guest's target has no floating-point registers, so a
//! float loop would measure soft-float, not the VM.)
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;
use alloc::vec::Vec;

wisp::main!(main);

fn main() -> i32 {
    let digits: usize = match wisp::env::arg(1).map(str::parse) {
        None => 1000,
        Some(Ok(n)) if n <= 100_000 => n,
        _ => {
            wisp::eprintln!("compute: DIGITS must be a number up to 100000");
            return 2;
        }
    };
    let mut out: Vec<u8> = Vec::with_capacity(digits + 3);
    out.extend_from_slice(b"2.");
    // e = 2 + 1/2 (1 + 1/3 (1 + 1/4 (1 + ...))): a[i] holds the mixed-radix
    // digit of 1/(i+2); each pass multiplies by 10 and carries out one
    // decimal.
    let n = digits + 10;
    let mut a = vec![1u32; n];
    for _ in 0..digits {
        let mut q = 0u32;
        for i in (0..n).rev() {
            let x = a[i] * 10 + q;
            let d = i as u32 + 2;
            a[i] = x % d;
            q = x / d;
        }
        out.push(b'0' + q as u8);
    }
    out.push(b'\n');
    wisp::console::write_bytes(&out);
    0
}
