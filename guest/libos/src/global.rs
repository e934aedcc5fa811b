//! Global state of a single-threaded, interrupt-free guest.

use core::cell::RefCell;

/// A global value. The guest has exactly one vCPU, no interrupts and no
/// preemption, so there is never concurrent access; `RefCell` still catches
/// re-entrant misuse at run time.
pub struct Global<T>(RefCell<T>);

// SAFETY: wisp guests run on a single vCPU with no interrupt handlers and no
// threads, so a `Global` is never accessed from two contexts at once.
unsafe impl<T> Sync for Global<T> {}

impl<T> Global<T> {
    /// A new global.
    pub const fn new(v: T) -> Global<T> {
        Global(RefCell::new(v))
    }

    /// Run `f` with mutable access to the value.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.borrow_mut())
    }
}
