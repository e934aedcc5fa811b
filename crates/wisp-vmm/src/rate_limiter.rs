//! Token buckets for a device's traffic (after Firecracker's
//! `rate_limiter`, a leaf that knows none of its users): a budget of bytes
//! and one of operations (frames), each refilled continuously at its rate
//! up to a burst of [`BURST`] worth of it. A device asks before each
//! operation and, when refused, waits for [`RateLimiter::ready_in`] instead
//! of dropping: the guest's ring fills and it slows down, or the host's
//! queue fills and the host drops, as a slower link would.

use std::time::{Duration, Instant};

/// How much of a second's budget may be spent at once.
pub const BURST: Duration = Duration::from_millis(100);

/// Rates of one direction of a device; 0 = unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rate {
    /// Bytes per second.
    pub bytes: u64,
    /// Operations (frames) per second.
    pub ops: u64,
}

impl Rate {
    /// No limit.
    pub fn is_unlimited(&self) -> bool {
        self.bytes == 0 && self.ops == 0
    }
}

/// One budget: `tokens` of `cap`, refilled at `rate` per second.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    rate: u64,
    cap: u64,
    tokens: u64,
}

impl Bucket {
    fn new(rate: u64, at_least: u64) -> Bucket {
        let cap = (rate as u128 * BURST.as_nanos() / 1_000_000_000).max(at_least as u128) as u64;
        Bucket { rate, cap, tokens: cap }
    }

    fn refill(&mut self, elapsed: Duration) {
        let add = (self.rate as u128 * elapsed.as_nanos() / 1_000_000_000).min(u64::MAX as u128) as u64;
        self.tokens = self.tokens.saturating_add(add).min(self.cap);
    }

    /// How long until `n` tokens are there (zero if they are).
    fn wait_for(&self, n: u64) -> Duration {
        let need = n.min(self.cap).saturating_sub(self.tokens);
        if need == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos((need as u128 * 1_000_000_000).div_ceil(self.rate as u128).min(u64::MAX as u128) as u64)
    }
}

/// A byte budget and an operation budget.
#[derive(Clone, Debug)]
pub struct RateLimiter {
    bytes: Option<Bucket>,
    ops: Option<Bucket>,
    last: Instant,
}

impl RateLimiter {
    /// A limiter for `rate`; `largest` is the largest single operation in
    /// bytes (the byte budget always holds at least one).
    pub fn new(rate: Rate, largest: u64) -> RateLimiter {
        RateLimiter {
            bytes: (rate.bytes > 0).then(|| Bucket::new(rate.bytes, largest)),
            ops: (rate.ops > 0).then(|| Bucket::new(rate.ops, 1)),
            last: Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let elapsed = now - self.last;
        self.last = now;
        for b in [&mut self.bytes, &mut self.ops].into_iter().flatten() {
            b.refill(elapsed);
        }
    }

    /// Spend the budget of one operation of `len` bytes if it is there.
    pub fn consume(&mut self, len: u64) -> bool {
        self.refill();
        if !self.ready_in_for(len).is_zero() {
            return false;
        }
        if let Some(b) = &mut self.bytes {
            b.tokens -= len.min(b.tokens);
        }
        if let Some(b) = &mut self.ops {
            b.tokens -= 1;
        }
        true
    }

    /// How long until an operation of `len` bytes would be allowed.
    pub fn ready_in(&mut self, len: u64) -> Duration {
        self.refill();
        self.ready_in_for(len)
    }

    fn ready_in_for(&self, len: u64) -> Duration {
        let b = self.bytes.map_or(Duration::ZERO, |b| b.wait_for(len));
        let o = self.ops.map_or(Duration::ZERO, |b| b.wait_for(1));
        b.max(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let mut r = RateLimiter::new(Rate { bytes: 100_000, ops: 0 }, 1500);
        // The burst: 100 ms worth, 10,000 bytes.
        let mut sent = 0;
        while r.consume(1000) {
            sent += 1000;
            assert!(sent <= 20_000, "the burst is bounded");
        }
        assert!((10_000..=11_000).contains(&sent), "{sent}");
        let wait = r.ready_in(1000);
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(11), "{wait:?}");
    }

    #[test]
    fn operations_are_counted_apart_from_bytes() {
        let mut r = RateLimiter::new(Rate { bytes: 0, ops: 50 }, 1500);
        let n = (0..100).take_while(|_| r.consume(64)).count();
        assert_eq!(n, 5, "100 ms of 50 per second");
        assert!(!r.ready_in(64).is_zero());
    }

    #[test]
    fn a_frame_larger_than_the_burst_still_passes() {
        // 1 KB/s: the burst (100 bytes) is smaller than a frame; the bucket
        // holds one frame so the link is slow, not dead.
        let mut r = RateLimiter::new(Rate { bytes: 1000, ops: 0 }, 1514);
        assert!(r.consume(1514));
        assert!(!r.consume(1514));
        let w = r.ready_in(1514);
        assert!(w > Duration::from_millis(1400) && w <= Duration::from_millis(1600), "{w:?}");
    }

    #[test]
    fn unlimited_never_waits() {
        let mut r = RateLimiter::new(Rate::default(), 1514);
        assert!((0..10_000).all(|_| r.consume(1514)));
        assert!(Rate::default().is_unlimited());
    }
}
