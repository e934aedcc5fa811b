//! A small cooperative async executor. Tasks run until they wait; when no
//! task can run, the executor parks the VM with *one* idle hypercall until
//! the earliest timer (or an event) — so an app can wait on many timers and
//! events at the cost of one exit.
//!
//! An I/O source (the network stack, once an app first uses it) plugs in
//! with `set_io_source` (crate-private): the executor polls it after every round of tasks
//! and after every wake-up, and parks only until the earlier of the next
//! timer and the source's own deadline. Apps that never use I/O never
//! register one and pay nothing for it.

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

/// A task slot.
enum Slot {
    /// Unused (reused by the next `spawn`).
    Free,
    /// The task being polled right now (its future is out of the table, so
    /// a task it spawns must not take this slot).
    Running,
    /// A task waiting to be polled.
    Waiting(BoxFuture),
}

struct Executor {
    tasks: Vec<Slot>,
    live: usize,
    ready: VecDeque<usize>,
    timers: BinaryHeap<Reverse<Timer>>,
    seq: u64,
    idles: u64,
}

/// An I/O source polled by the executor (see the module docs).
pub(crate) struct IoSource {
    /// Do the pending I/O work and wake the tasks it concerns.
    pub poll: fn() -> IoPoll,
    /// Cheap check whether `poll` would find work now (used while spinning
    /// briefly before parking).
    pub pending: fn() -> bool,
}

/// What a poll of an [`IoSource`] found.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IoPoll {
    /// Monotonic time (ns) by which the source wants to be polled again.
    pub next: Option<u64>,
    /// Whether it moved data (then more is likely to follow soon).
    pub busy: bool,
}

/// How long the executor spins re-checking a busy I/O source before it
/// parks: a park and wake-up costs about 40 µs of exits on PVM hosts.
const SPIN_NS: u64 = 30_000;

static IO: Global<Option<&'static IoSource>> = Global::new(None);

/// Register the I/O source (once; a second one replaces the first).
pub(crate) fn set_io_source(src: &'static IoSource) {
    IO.with(|io| *io = Some(src));
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
///
/// The future must be `'static`: it may outlive the caller's frame, so it
/// owns what it uses — move values in (`async move`), share with `Rc`.
///
/// ```ignore
/// let hits = alloc::rc::Rc::new(core::cell::Cell::new(0));
/// let h = hits.clone();
/// wisp::exec::spawn(async move {
///     wisp::exec::sleep(core::time::Duration::from_millis(5)).await;
///     h.set(h.get() + 1);
/// });
/// wisp::exec::run(); // until every task is done
/// assert_eq!(hits.get(), 1);
/// ```
pub fn spawn(f: impl Future<Output = ()> + 'static) {
    EXEC.with(|e| {
        let id = match e.tasks.iter().position(|t| matches!(t, Slot::Free)) {
            Some(i) => {
                e.tasks[i] = Slot::Waiting(Box::pin(f));
                i
            }
            None => {
                e.tasks.push(Slot::Waiting(Box::pin(f)));
                e.tasks.len() - 1
            }
        };
        e.live += 1;
        e.ready.push_back(id);
    });
}

/// Run `f` (and any spawned tasks) until `f` completes; return its output.
/// `f` must be `'static`, as for [`spawn`] (a borrow of a local in it is
/// the error `E0373`/`E0597`: move the value in instead).
///
/// ```ignore
/// let n = wisp::exec::block_on(async {
///     wisp::exec::sleep(core::time::Duration::from_millis(1)).await;
///     42
/// });
/// ```
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
    // Spin before parking until SPIN_NS after the I/O source last moved
    // data — not only right after a poll that did: such a poll wakes
    // tasks, and the poll after them usually finds nothing new yet.
    let mut spin_until = 0u64;
    'outer: loop {
        // Run the tasks that are ready now; tasks they wake run in the next
        // round, after I/O has been polled.
        let mut round = EXEC.with(|e| e.ready.len());
        while round > 0 {
            round -= 1;
            let Some(id) = EXEC.with(|e| e.ready.pop_front()) else { break };
            let task = EXEC.with(|e| match e.tasks.get_mut(id) {
                Some(slot @ Slot::Waiting(_)) => match core::mem::replace(slot, Slot::Running) {
                    Slot::Waiting(fut) => Some(fut),
                    _ => None,
                },
                _ => None,
            });
            let Some(mut fut) = task else {
                continue; // finished, or woken twice in one round
            };
            let waker = Waker::from(Arc::new(TaskWaker(id)));
            let mut cx = Context::from_waker(&waker);
            match fut.as_mut().poll(&mut cx) {
                Poll::Ready(()) => EXEC.with(|e| {
                    e.tasks[id] = Slot::Free;
                    e.live -= 1;
                }),
                Poll::Pending => EXEC.with(|e| e.tasks[id] = Slot::Waiting(fut)),
            }
            if done() {
                return;
            }
        }
        if done() {
            return;
        }
        // Move I/O (sending what the tasks queued, taking what arrived).
        let io = IO.with(|io| *io);
        let polled = io.map(|src| (src.poll)()).unwrap_or_default();
        if polled.busy {
            spin_until = Instant::now().as_nanos().saturating_add(SPIN_NS);
        }
        if EXEC.with(|e| !e.ready.is_empty()) {
            continue;
        }
        // Nothing ready: fire due timers, or park until the earliest one.
        let mut now = Instant::now().as_nanos();
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
        let deadline = match (next, polled.next) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(u64::MAX),
        };
        if deadline <= now {
            continue; // the I/O source wants another poll right away
        }
        if let (Some(src), true) = (io, now < spin_until) {
            // Traffic is flowing: the next frame is likely to arrive sooner
            // than a park and wake-up would take.
            let spin_end = spin_until.min(deadline);
            while now < spin_end {
                if (src.pending)() {
                    continue 'outer;
                }
                core::hint::spin_loop();
                now = Instant::now().as_nanos();
            }
            if now >= deadline {
                continue;
            }
        }
        EXEC.with(|e| e.idles += 1);
        // Events need no handling here beyond `dispatch_events`: the loop
        // polls the I/O source again right after the wake-up (NET).
        let timeout = if deadline == u64::MAX { u64::MAX } else { deadline - now };
        crate::process::dispatch_events(crate::hypercall::idle(timeout));
    }
}

/// A future that completes at a deadline.
pub struct Sleep {
    deadline: Instant,
    /// The waker its timer holds, once it has one: polled again by the
    /// same task (as a sleep raced against I/O is, at every wake-up) it
    /// adds no timer.
    armed: Option<Waker>,
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            return Poll::Ready(());
        }
        if self.armed.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return Poll::Pending;
        }
        let deadline = self.deadline.as_nanos();
        let waker = cx.waker().clone();
        self.armed = Some(waker.clone());
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
    Sleep { deadline, armed: None }
}

/// Wait for `d`.
pub fn sleep(d: Duration) -> Sleep {
    Sleep { deadline: Instant::now().add(d), armed: None }
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

/// One of two outcomes ([`race`]).
pub enum Either<A, B> {
    /// The first future's.
    Left(A),
    /// The second future's.
    Right(B),
}

/// Whichever of `a` and `b` completes first (`a` if both are ready); the
/// other is dropped.
pub async fn race<A: Future, B: Future>(a: A, b: B) -> Either<A::Output, B::Output> {
    let mut a = core::pin::pin!(a);
    let mut b = core::pin::pin!(b);
    core::future::poll_fn(|cx| {
        if let Poll::Ready(v) = a.as_mut().poll(cx) {
            return Poll::Ready(Either::Left(v));
        }
        if let Poll::Ready(v) = b.as_mut().poll(cx) {
            return Poll::Ready(Either::Right(v));
        }
        Poll::Pending
    })
    .await
}

/// `fut`'s output, or `None` once `d` has passed.
///
/// ```ignore
/// match wisp::exec::timeout(Duration::from_secs(5), conn.read(&mut buf)).await {
///     None => { /* nothing came in 5 s */ }
///     Some(r) => { /* the read's result */ }
/// }
/// ```
pub async fn timeout<T>(d: Duration, fut: impl Future<Output = T>) -> Option<T> {
    match race(fut, sleep(d)).await {
        Either::Left(v) => Some(v),
        Either::Right(()) => None,
    }
}

