//! A small cooperative async executor. Tasks run until they wait; when no
//! task can run, the executor parks the VM with *one* idle hypercall until
//! the earliest timer (or an event) — so an app can wait on many timers and
//! events at the cost of one exit.

use alloc::boxed::Box;
use alloc::collections::{BinaryHeap, VecDeque};
use alloc::rc::Rc;
use alloc::sync::Arc;
use alloc::task::Wake;
use alloc::vec::Vec;
use core::cell::RefCell;
use core::cmp::{Ordering, Reverse};
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;

use crate::global::Global;
use crate::time::Instant;

type BoxFuture = Pin<Box<dyn Future<Output = ()>>>;

struct Timer {
    deadline: u64,
    seq: u64,
    waker: Waker,
}

impl PartialEq for Timer {
    fn eq(&self, o: &Self) -> bool {
        (self.deadline, self.seq) == (o.deadline, o.seq)
    }
}
impl Eq for Timer {}
impl PartialOrd for Timer {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timer {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.deadline, self.seq).cmp(&(o.deadline, o.seq))
    }
}

struct Executor {
    tasks: Vec<Option<BoxFuture>>,
    live: usize,
    ready: VecDeque<usize>,
    timers: BinaryHeap<Reverse<Timer>>,
    seq: u64,
    idles: u64,
}

static EXEC: Global<Executor> = Global::new(Executor {
    tasks: Vec::new(),
    live: 0,
    ready: VecDeque::new(),
    timers: BinaryHeap::new(),
    seq: 0,
    idles: 0,
});

struct TaskWaker(usize);

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        EXEC.with(|e| e.ready.push_back(self.0));
    }
}

/// Start a task. It runs while [`block_on`] or [`run`] drive the executor.
pub fn spawn(f: impl Future<Output = ()> + 'static) {
    EXEC.with(|e| {
        let id = match e.tasks.iter().position(Option::is_none) {
            Some(i) => {
                e.tasks[i] = Some(Box::pin(f));
                i
            }
            None => {
                e.tasks.push(Some(Box::pin(f)));
                e.tasks.len() - 1
            }
        };
        e.live += 1;
        e.ready.push_back(id);
    });
}

/// Run `f` (and any spawned tasks) until `f` completes; return its output.
pub fn block_on<T: 'static>(f: impl Future<Output = T> + 'static) -> T {
    let out: Rc<RefCell<Option<T>>> = Rc::new(RefCell::new(None));
    let slot = out.clone();
    spawn(async move {
        let v = f.await;
        *slot.borrow_mut() = Some(v);
    });
    drive(|| out.borrow().is_some());
    let v = out.borrow_mut().take();
    v.expect("block_on: the future completed")
}

/// Run until every spawned task has completed.
pub fn run() {
    drive(|| EXEC.with(|e| e.live == 0));
}

/// Idle hypercalls the executor has made so far.
pub fn idle_count() -> u64 {
    EXEC.with(|e| e.idles)
}

fn drive(done: impl Fn() -> bool) {
    loop {
        // Run every ready task.
        while let Some(id) = EXEC.with(|e| e.ready.pop_front()) {
            let Some(mut fut) = EXEC.with(|e| e.tasks.get_mut(id).and_then(Option::take)) else {
                continue; // finished, or woken twice in one round
            };
            let waker = Waker::from(Arc::new(TaskWaker(id)));
            let mut cx = Context::from_waker(&waker);
            match fut.as_mut().poll(&mut cx) {
                Poll::Ready(()) => EXEC.with(|e| e.live -= 1),
                Poll::Pending => EXEC.with(|e| e.tasks[id] = Some(fut)),
            }
            if done() {
                return;
            }
        }
        if done() {
            return;
        }
        // Nothing ready: fire due timers, or park until the earliest one.
        let now = Instant::now().as_nanos();
        let (fired, next) = EXEC.with(|e| {
            let mut fired = Vec::new();
            while e.timers.peek().is_some_and(|t| t.0.deadline <= now) {
                if let Some(Reverse(t)) = e.timers.pop() {
                    fired.push(t.waker);
                }
            }
            (fired, e.timers.peek().map(|t| t.0.deadline))
        });
        if !fired.is_empty() {
            fired.into_iter().for_each(Waker::wake);
            continue;
        }
        if EXEC.with(|e| e.live == 0) {
            return;
        }
        let timeout = next.map_or(u64::MAX, |d| d.saturating_sub(now));
        EXEC.with(|e| e.idles += 1);
        crate::process::dispatch_events(crate::hypercall::idle(timeout));
    }
}

/// A future that completes at a deadline.
pub struct Sleep {
    deadline: Instant,
}

impl Future for Sleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            return Poll::Ready(());
        }
        let deadline = self.deadline.as_nanos();
        let waker = cx.waker().clone();
        EXEC.with(|e| {
            e.seq += 1;
            let seq = e.seq;
            e.timers.push(Reverse(Timer { deadline, seq, waker }));
        });
        Poll::Pending
    }
}

/// Wait until `deadline`.
pub fn sleep_until(deadline: Instant) -> Sleep {
    Sleep { deadline }
}

/// Wait for `d`.
pub fn sleep(d: Duration) -> Sleep {
    Sleep { deadline: Instant::now().add(d) }
}

/// Let other ready tasks run once.
pub async fn yield_now() {
    let mut yielded = false;
    core::future::poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}
