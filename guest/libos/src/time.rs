//! Clocks and sleeping. Time is read from the TSC without leaving the guest;
//! the boot-info page gives its frequency and the wall-clock base.

use core::time::Duration;

pub use core::time::Duration as Span;

/// Read the time-stamp counter.
#[inline(always)]
pub fn rdtsc() -> u64 {
    // SAFETY: `rdtsc` is allowed at CPL 3 (CR4.TSD is clear) and has no side effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Nanoseconds since boot (monotonic).
pub fn monotonic_ns() -> u64 {
    let info = crate::env::boot_info();
    if info.tsc_hz == 0 {
        return crate::hypercall::clock().0;
    }
    ticks_ns(rdtsc().wrapping_sub(info.boot_tsc))
}

/// Nanoseconds `ticks` of the TSC take (at the boot-info page's frequency).
pub fn ticks_ns(ticks: u64) -> u64 {
    (ticks as u128 * 1_000_000_000 / crate::env::boot_info().tsc_hz.max(1) as u128) as u64
}

/// Wall-clock time: nanoseconds since the Unix epoch.
pub fn wall_ns() -> u64 {
    crate::env::boot_info().wall_clock_ns + monotonic_ns()
}

/// A point on the monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant(u64);

impl Instant {
    /// Now.
    pub fn now() -> Instant {
        Instant(monotonic_ns())
    }

    /// Nanoseconds since boot.
    pub fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time since `self`.
    pub fn elapsed(self) -> Duration {
        Instant::now().saturating_duration_since(self)
    }

    /// `self - earlier`, or zero.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `self + d`.
    pub fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(d.as_nanos().min(u64::MAX as u128) as u64))
    }
}

/// Time since boot.
pub fn uptime() -> Duration {
    Duration::from_nanos(monotonic_ns())
}

/// Park the VM until `deadline` (no CPU is used meanwhile).
pub fn sleep_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        crate::process::dispatch_events(crate::hypercall::idle(deadline.0 - now.0));
    }
}

/// Park the VM for `d`.
pub fn sleep(d: Duration) {
    sleep_until(Instant::now().add(d));
}

pub use wisp_app::civil;

/// Parse a duration like `1s`, `500ms`, `250us`, `2m` or a bare number of
/// seconds.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "ns" => Duration::from_nanos(n),
        "us" | "µs" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" | "min" => Duration::from_secs(n.checked_mul(60)?),
        "h" => Duration::from_secs(n.checked_mul(3600)?),
        _ => return None,
    })
}
