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

/// One budget: `tokens` of `cap`, refilled at `rate` per second. What a
/// refill earns beyond whole tokens is kept (`part`, in token-nanoseconds)
/// for the next one, so a limiter asked often (every few ms, as the NIC's
/// I/O thread does) refills at its rate and not slower. An operation
/// costing more than the bucket holds (a super-frame of many segments)
/// passes once the bucket holds as much as it can, and leaves a `debt`
/// that the refills pay before anything else passes: over time the rate
/// holds whatever the operations' sizes.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    rate: u64,
    cap: u64,
    tokens: u64,
    /// Spent beyond the tokens there were (then `tokens` is 0).
    debt: u64,
    /// The part of a token earned so far, × 10⁹ (below 10⁹).
    part: u128,
}

const NANOS: u128 = 1_000_000_000;

impl Bucket {
    fn new(rate: u64, at_least: u64) -> Bucket {
        let cap = (rate as u128 * BURST.as_nanos() / NANOS).max(at_least as u128) as u64;
        Bucket { rate, cap, tokens: cap, debt: 0, part: 0 }
    }

    fn refill(&mut self, elapsed: Duration) {
        let earned = (self.rate as u128).saturating_mul(elapsed.as_nanos()).saturating_add(self.part);
        let mut add = (earned / NANOS).min(u64::MAX as u128) as u64;
        let paid = add.min(self.debt);
        self.debt -= paid;
        add -= paid;
        self.tokens = self.tokens.saturating_add(add).min(self.cap);
        // A full bucket earns nothing more.
        self.part = if self.tokens == self.cap && self.debt == 0 { 0 } else { earned % NANOS };
    }

    /// How long until `n` tokens are there (zero if they are).
    fn wait_for(&self, n: u64) -> Duration {
        let need = n.min(self.cap).saturating_add(self.debt).saturating_sub(self.tokens);
        if need == 0 {
            return Duration::ZERO;
        }
        let left = (need as u128 * NANOS).saturating_sub(self.part);
        Duration::from_nanos(left.div_ceil(self.rate as u128).min(u64::MAX as u128) as u64)
    }

    /// Spend `n` tokens (a debt for what is not there).
    fn spend(&mut self, n: u64) {
        let from_tokens = n.min(self.tokens);
        self.tokens -= from_tokens;
        self.debt = self.debt.saturating_add(n - from_tokens);
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
        Self::new_at(rate, largest, Instant::now())
    }

    /// [`RateLimiter::new`] with its budgets full at `now`.
    pub fn new_at(rate: Rate, largest: u64, now: Instant) -> RateLimiter {
        RateLimiter {
            bytes: (rate.bytes > 0).then(|| Bucket::new(rate.bytes, largest)),
            ops: (rate.ops > 0).then(|| Bucket::new(rate.ops, 1)),
            last: now,
        }
    }

    /// Refill up to `now`; a time before the last one adds nothing.
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last);
        self.last = self.last.max(now);
        for b in [&mut self.bytes, &mut self.ops].into_iter().flatten() {
            b.refill(elapsed);
        }
    }

    /// Spend the budget of one operation of `len` bytes if it is there.
    pub fn consume(&mut self, len: u64) -> bool {
        self.consume_at(len, Instant::now())
    }

    /// [`RateLimiter::consume`] at time `now` (the I/O thread's clock, or
    /// a test's or fuzzer's).
    pub fn consume_at(&mut self, len: u64, now: Instant) -> bool {
        self.consume_ops_at(len, 1, now)
    }

    /// Spend the budget of `ops` operations of `len` bytes together (a
    /// super-frame of `ops` segments) if it is there: as much as each
    /// bucket can hold, the rest paid later (see `Bucket`).
    pub fn consume_ops_at(&mut self, len: u64, ops: u64, now: Instant) -> bool {
        self.refill(now);
        if !self.ready_in_for(len, ops).is_zero() {
            return false;
        }
        self.spend(len, ops);
        true
    }

    /// Spend the budget of `ops` operations of `len` bytes whether it is
    /// there or not (an operation already done, e.g. a frame read from a
    /// tap): what is missing is a debt the refills pay first.
    pub fn charge_at(&mut self, len: u64, ops: u64, now: Instant) {
        self.refill(now);
        self.spend(len, ops);
    }

    /// Take `len` bytes and `ops` operations from the buckets (a bucket
    /// that runs short carries a debt).
    fn spend(&mut self, len: u64, ops: u64) {
        if let Some(b) = &mut self.bytes {
            b.spend(len);
        }
        if let Some(b) = &mut self.ops {
            b.spend(ops);
        }
    }

    /// How long until an operation of `len` bytes would be allowed.
    pub fn ready_in(&mut self, len: u64) -> Duration {
        self.ready_in_at(len, Instant::now())
    }

    /// [`RateLimiter::ready_in`] at time `now`.
    pub fn ready_in_at(&mut self, len: u64, now: Instant) -> Duration {
        self.ready_in_ops_at(len, 1, now)
    }

    /// How long until `ops` operations of `len` bytes together would be
    /// allowed, at time `now`.
    pub fn ready_in_ops_at(&mut self, len: u64, ops: u64, now: Instant) -> Duration {
        self.refill(now);
        self.ready_in_for(len, ops)
    }

    fn ready_in_for(&self, len: u64, ops: u64) -> Duration {
        let b = self.bytes.map_or(Duration::ZERO, |b| b.wait_for(len));
        let o = self.ops.map_or(Duration::ZERO, |b| b.wait_for(ops));
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
    fn asking_often_does_not_slow_the_refill() {
        // 20 frames per second, asked every millisecond for a second (the
        // I/O thread asks whenever it wakes): about 20 frames pass, plus
        // the burst of 2. Rounding each refill down to whole frames let
        // none through after the burst.
        let t = Instant::now();
        let mut r = RateLimiter::new_at(Rate { bytes: 0, ops: 20 }, 1514, t);
        let passed = (0..=1000).filter(|ms| r.consume_at(64, t + Duration::from_millis(*ms))).count();
        assert_eq!(passed, 2 + 20);
        // Bytes alike: 1000 bytes/s asked every 1 ms (one byte each time).
        let mut r = RateLimiter::new_at(Rate { bytes: 1000, ops: 0 }, 100, t);
        assert!(r.consume_at(100, t), "the burst");
        assert!(!r.consume_at(10, t));
        let at = (1..=1000).find(|ms| r.consume_at(10, t + Duration::from_millis(*ms)));
        assert_eq!(at, Some(10), "10 bytes after 10 ms");
        // The wait it announces is the time the part already earned leaves.
        let mut r = RateLimiter::new_at(Rate { bytes: 0, ops: 20 }, 1514, t);
        assert!(r.consume_at(1, t) && r.consume_at(1, t));
        assert_eq!(r.ready_in_at(1, t + Duration::from_millis(30)), Duration::from_millis(20));
    }

    #[test]
    fn time_running_backwards_or_far_ahead_is_harmless() {
        let t = Instant::now() + Duration::from_secs(1);
        let mut r = RateLimiter::new_at(Rate { bytes: u64::MAX, ops: u64::MAX }, 1514, t);
        assert!(r.consume_at(u64::MAX, t - Duration::from_secs(1)));
        assert!(r.consume_at(1, t + Duration::from_secs(u32::MAX as u64 * 1000)));
    }

    #[test]
    fn super_frames_pay_for_every_segment() {
        // 20 frames/s (a burst of 2): a super-frame of 45 segments passes
        // when the bucket is full, then nothing until its debt is paid.
        let t = Instant::now();
        let mut r = RateLimiter::new_at(Rate { bytes: 0, ops: 20 }, 1514, t);
        assert!(r.consume_ops_at(65_000, 45, t));
        assert!(!r.consume_at(64, t + Duration::from_millis(2000)), "43 segments of debt take 2.15 s");
        assert_eq!(r.ready_in_at(64, t + Duration::from_millis(2000)), Duration::from_millis(200));
        assert!(r.consume_at(64, t + Duration::from_millis(2200)));
        // Over 10 s of super-frames asked every ms, segments hold the rate.
        let mut r = RateLimiter::new_at(Rate { bytes: 0, ops: 20 }, 1514, t);
        let segs: u64 = (0..=10_000).filter(|ms| r.consume_ops_at(65_000, 45, t + Duration::from_millis(*ms))).count() as u64 * 45;
        assert!(segs <= 2 + 20 * 10 + 45, "{segs} segments in 10 s");
        // Bytes alike: 64 KiB frames through 1 MB/s.
        let mut r = RateLimiter::new_at(Rate { bytes: 1_000_000, ops: 0 }, 65_549, t);
        let sent: u64 = (0..=10_000).filter(|ms| r.consume_at(65_549, t + Duration::from_millis(*ms))).count() as u64 * 65_549;
        assert!(sent <= 10_000_000 + 2 * 65_549, "{sent} bytes in 10 s");
        assert!(sent >= 9_000_000, "{sent} bytes in 10 s");
        // Charged after the fact (a frame already read): a debt all the same.
        let mut r = RateLimiter::new_at(Rate { bytes: 1000, ops: 10 }, 1514, t);
        r.charge_at(65_549, 45, t);
        assert!(!r.consume_at(1, t + Duration::from_secs(4)), "45 frames at 10/s");
        assert!(!r.consume_at(1, t + Duration::from_secs(60)), "65,549 bytes at 1000/s");
        assert!(r.consume_at(1, t + Duration::from_secs(65)));
    }

    #[test]
    fn unlimited_never_waits() {
        let mut r = RateLimiter::new(Rate::default(), 1514);
        assert!((0..10_000).all(|_| r.consume(1514)));
        assert!(Rate::default().is_unlimited());
    }
}
