//! Signals between the tasks of one test (racing two futures is the
//! executor's: `wisp::exec::race`).

use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::future::{poll_fn, Future};
use core::pin::pin;
use core::task::{Poll, Waker};

/// A one-shot flag tasks can wait for; [`Signal::notify`] also wakes the
/// waiters without setting it (for "something changed, look again").
#[derive(Default)]
pub struct Signal {
    set: Cell<bool>,
    wakers: RefCell<Vec<Waker>>,
}

impl Signal {
    /// Set the flag and wake every waiter.
    pub fn set(&self) {
        self.set.set(true);
        self.notify();
    }

    /// Wake every waiter.
    pub fn notify(&self) {
        let wakers = core::mem::take(&mut *self.wakers.borrow_mut());
        wakers.into_iter().for_each(Waker::wake);
    }

    pub fn is_set(&self) -> bool {
        self.set.get()
    }

    /// Wake `w` at the next `set` or `notify`.
    pub fn register(&self, w: &Waker) {
        let mut ws = self.wakers.borrow_mut();
        if !ws.iter().any(|x| x.will_wake(w)) {
            ws.push(w.clone());
        }
    }

    /// Wait until the flag is set.
    pub async fn wait(&self) {
        poll_fn(|cx| {
            if self.is_set() {
                Poll::Ready(())
            } else {
                self.register(cx.waker());
                Poll::Pending
            }
        })
        .await
    }
}

/// Run `f` until it completes (`Some`) or `sig` is set (`None`).
pub async fn until<F: Future>(sig: &Signal, f: F) -> Option<F::Output> {
    let mut f = pin!(f);
    poll_fn(|cx| {
        if sig.is_set() {
            return Poll::Ready(None);
        }
        if let Poll::Ready(v) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        sig.register(cx.waker());
        Poll::Pending
    })
    .await
}

