//! Caps on concurrent connections (API connections, forwarded connections):
//! a count of slots, each held by one connection (and its threads) for its
//! life. A connection that finds none free is answered or refused at once,
//! so the daemon never runs threads without bound.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

struct Inner {
    used: AtomicUsize,
    max: usize,
}

/// A fixed number of slots.
#[derive(Clone)]
pub struct Slots(Arc<Inner>);

/// One slot, given back when dropped.
pub struct Slot(Arc<Inner>);

impl Slots {
    /// `max` slots.
    pub fn new(max: usize) -> Slots {
        Slots(Arc::new(Inner { used: AtomicUsize::new(0), max }))
    }

    /// A free slot, if there is one.
    pub fn try_take(&self) -> Option<Slot> {
        let i = &self.0;
        i.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < i.max).then_some(n + 1)).ok()?;
        Some(Slot(i.clone()))
    }

    /// How many slots there are.
    pub fn max(&self) -> usize {
        self.0.max
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_run_out_and_come_back() {
        let s = Slots::new(2);
        let (a, b) = (s.try_take().unwrap(), s.try_take().unwrap());
        assert!(s.try_take().is_none());
        drop(a);
        let c = s.try_take().unwrap();
        assert!(s.try_take().is_none());
        drop((b, c));
        assert!(Slots::new(0).try_take().is_none());
        assert_eq!(s.max(), 2);
    }
}
