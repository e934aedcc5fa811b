//! `counter [TICKS] [INTERVAL]`: counts TICKS ticks (default 50), one each
//! INTERVAL (default 20ms). Each tick appends 512 squares to a vector on
//! the heap (4 KiB more RAM) and prints `count K sum S`, S being the sum of
//! the whole vector read back: a VM that is snapshotted and restored part
//! way goes on from its count, and its sums say its memory came back
//! whole. Ends with `counter: done, sum S` and exit status 0. It says it
//! is ready (`wisp::ready`) before the first tick: a template of it is
//! saved there.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec::Vec;
use core::time::Duration;

use wisp::time::parse_duration;

wisp::main!(main, wisp::Manifest::new().features(wisp::features::READY));

/// Entries added per tick (4 KiB).
const PER_TICK: u64 = 512;

fn main() -> i32 {
    let ticks = match wisp::env::arg(1).map(|s| s.parse::<u64>()) {
        None => 50,
        Some(Ok(n)) => n,
        Some(Err(_)) => return usage(),
    };
    let interval = match wisp::env::arg(2).map(parse_duration) {
        None => Duration::from_millis(20),
        Some(Some(d)) => d,
        Some(None) => return usage(),
    };
    // Made into a template (`wisp run --template`), the VM is saved here:
    // its instances count from here on.
    let _ = wisp::ready();
    let mut squares: Vec<u64> = Vec::new();
    let sum = wisp::exec::block_on(async move {
        for k in 1..=ticks {
            for i in squares.len() as u64..k * PER_TICK {
                squares.push(i.wrapping_mul(i));
            }
            let sum = squares.iter().fold(0u64, |a, &x| a.wrapping_add(x));
            wisp::println!("count {} sum {}", k, sum);
            wisp::exec::sleep(interval).await;
        }
        squares.iter().fold(0u64, |a, &x| a.wrapping_add(x))
    });
    wisp::println!("counter: done, sum {}", sum);
    0
}

fn usage() -> i32 {
    wisp::println!("usage: counter [TICKS] [INTERVAL]   e.g. counter 100 10ms");
    2
}
