//! `sleeper [TOTAL] [INTERVAL]`: sleeps in a loop, waking every INTERVAL
//! (default 1s), for TOTAL (default: forever), then exits 0. While asleep
//! the VM is parked in the idle hypercall and uses no CPU (density tests).
#![no_std]
#![no_main]

use core::time::Duration;

use wisp::time::{parse_duration, Instant};

wisp::main!(main);

fn main() -> i32 {
    let total = match wisp::env::arg(1).map(parse_duration) {
        None => None,
        Some(Some(d)) => Some(d),
        Some(None) => return usage(),
    };
    let interval = match wisp::env::arg(2).map(parse_duration) {
        None => Duration::from_secs(1),
        Some(Some(d)) if !d.is_zero() => d,
        Some(_) => return usage(),
    };
    let start = Instant::now();
    wisp::println!("sleeper: sleeping {:?} every {:?}", total, interval);
    let wakes = wisp::exec::block_on(async move {
        let mut wakes = 0u64;
        loop {
            let next = match total {
                Some(t) if start.elapsed() >= t => break wakes,
                Some(t) => interval.min(t - start.elapsed()),
                None => interval,
            };
            wisp::exec::sleep(next).await;
            wakes += 1;
        }
    });
    wisp::println!("sleeper: done after {} wakes, {} ms", wakes, start.elapsed().as_millis());
    0
}

fn usage() -> i32 {
    wisp::println!("usage: sleeper [TOTAL] [INTERVAL]   e.g. sleeper 10s 100ms");
    2
}
