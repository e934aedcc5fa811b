//! The family's guest-visible IPC page: pipe rings and signal cells that
//! the VMs of a family read and write directly, so that a pipe write, a
//! pipe read or a signal between two running members takes no exit.
//!
//! One [`Rings`] block per family lives in memory every member's monitor
//! maps (the family region), and each member's guest sees it at
//! [`RINGS_GPA`] once it asked for it ([`super::op::RINGS`]). The monitors
//! keep what they trust elsewhere (descriptor tables, reference counts,
//! members); what is here is written by guests too and is only ever read as
//! untrusted input: every index is checked, a ring whose positions make no
//! sense is *corrupt* (the call that finds it fails with `EIO` and the
//! ring starts empty again), and anything unusual — an empty or full ring,
//! a lock held too long, an end closed, a corrupt ring — sends the guest to
//! the monitor (the slow path), which decides with what it trusts.
//!
//! Protocol of a pipe ring: `head` and `tail` count bytes consumed and
//! produced (mod 2^32, at most [`PIPE_CAPACITY`] apart); whoever moves data
//! holds `lock` (the holder's family pid) for the copy only. A party that
//! found nothing to do and is going to sleep in the monitor sets a bit in
//! `waiters` first (the monitor does this for it) and then looks again; a
//! party that moved data or released the lock looks at `waiters` afterwards
//! and, if it is set, clears it and wakes the sleepers
//! ([`super::op::WAKE`]). Both orders are sequentially consistent, so a
//! wake-up is never lost. Signals: a sender sets the bit in the target's
//! [`Cell::signals`] and wakes it if its [`Cell::parked`] is set; `SIGKILL`
//! always goes through the monitor.
//!
//! The algorithms are here, shared by the library OS (fast path) and the
//! monitor (slow path), so that both apply the same rules.

use core::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicU8, Ordering::*};

use super::limits::{MAX_MEMBERS, MAX_PIPES, MAX_QUEUES, MSG_MAX, PIPE_BUF, PIPE_CAPACITY, QUEUE_BYTES, QUEUE_MESSAGES};

/// Guest-physical address of the rings: right after the shared-memory
/// window, mapped by the monitor's page tables like it (2 MiB page).
pub const RINGS_GPA: u64 = crate::layout::SHM_BASE + crate::layout::SHM_SIZE;
/// Bytes reserved for the rings at [`RINGS_GPA`].
pub const RINGS_SIZE: u64 = crate::layout::LARGE_PAGE_SIZE;

/// [`PipeRing::waiters`]: a reader sleeps in the monitor.
pub const WAIT_READER: u32 = 1;
/// [`PipeRing::waiters`]: a writer sleeps in the monitor.
pub const WAIT_WRITER: u32 = 2;
/// [`PipeRing::closed`]: no write end is open (a hint: read then asks the monitor).
pub const NO_WRITERS: u32 = 1;
/// [`PipeRing::closed`]: no read end is open (a hint: write then asks the monitor).
pub const NO_READERS: u32 = 2;

/// One member's signal cell.
#[repr(C, align(64))]
pub struct Cell {
    /// The family pid of the member in this slot (0: none); written by
    /// monitors when a member starts and ends.
    pub fpid: AtomicI32,
    /// 1 while the member's vCPU sleeps in its monitor (a blocking family
    /// call or idle); a sender that set a signal then wakes it.
    pub parked: AtomicU32,
    /// The family pid of the member's parent (0: a root, or once the parent
    /// ended); written by monitors.
    pub ppid: AtomicI32,
    /// Pending signals sent through this page (bit `n` = signal `n`).
    pub signals: AtomicU64,
}

/// One pipe's ring.
#[repr(C, align(64))]
pub struct PipeRing {
    /// 0 when free, else the family pid of the party copying.
    pub lock: AtomicU32,
    /// [`WAIT_READER`] | [`WAIT_WRITER`].
    pub waiters: AtomicU32,
    /// Bytes consumed.
    pub head: AtomicU32,
    /// Bytes produced.
    pub tail: AtomicU32,
    /// [`NO_WRITERS`] | [`NO_READERS`], set by monitors.
    pub closed: AtomicU32,
    _pad: [u32; 11],
    pub data: [AtomicU8; PIPE_CAPACITY],
}

/// One message queue: its messages in order (`types`/`lens`, `count` of
/// them) and their bytes back to back in `data` (`bytes` of them). A
/// receive takes the first message that matches and closes the gap.
#[repr(C, align(64))]
pub struct QueueRing {
    /// As [`PipeRing::lock`] (see [`Shared`]).
    pub lock: AtomicU32,
    /// [`WAIT_READER`] (receivers) | [`WAIT_WRITER`] (senders).
    pub waiters: AtomicU32,
    /// 1 while the queue exists, with id `id` (written by monitors; a guest
    /// that finds anything else asks the monitor).
    pub live: AtomicU32,
    pub count: AtomicU32,
    pub id: AtomicU64,
    pub bytes: AtomicU32,
    _pad: [u32; 9],
    pub types: [AtomicI64; QUEUE_MESSAGES],
    pub lens: [AtomicU32; QUEUE_MESSAGES],
    pub data: [AtomicU8; QUEUE_BYTES],
}

/// The whole page.
#[repr(C)]
pub struct Rings {
    pub cells: [Cell; MAX_MEMBERS],
    pub pipes: [PipeRing; MAX_PIPES],
    pub queues: [QueueRing; MAX_QUEUES],
}

const _: () = assert!(core::mem::size_of::<Rings>() as u64 <= RINGS_SIZE);

/// What a ring operation found instead of doing its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// Nothing to read, or no room for the write.
    Wait,
    /// The ring's positions make no sense (someone wrote over them).
    Corrupt,
}

/// The lock and the sleepers' bits of a ring (pipe or queue).
pub trait Shared {
    /// 0 when free, else the family pid of the party copying.
    fn lock_word(&self) -> &AtomicU32;
    /// [`WAIT_READER`] | [`WAIT_WRITER`].
    fn waiters_word(&self) -> &AtomicU32;

    /// Take the lock for family pid `who` (> 0) if it is free.
    fn try_lock(&self, who: u32) -> bool {
        self.lock_word().compare_exchange(0, who, SeqCst, Relaxed).is_ok()
    }

    /// Release the lock; true if sleepers are to be woken (the caller then
    /// wakes them: [`super::op::WAKE`]): when the holder moved something
    /// (`progress`). A holder that found nothing to do leaves the bits to
    /// those who will.
    fn unlock(&self, progress: bool) -> bool {
        self.lock_word().store(0, SeqCst);
        progress && self.take_waiters()
    }

    /// Clear the sleepers' bits; true if any was set.
    fn take_waiters(&self) -> bool {
        self.waiters_word().load(SeqCst) != 0 && self.waiters_word().swap(0, SeqCst) != 0
    }
}

impl Shared for PipeRing {
    fn lock_word(&self) -> &AtomicU32 {
        &self.lock
    }
    fn waiters_word(&self) -> &AtomicU32 {
        &self.waiters
    }
}

impl Shared for QueueRing {
    fn lock_word(&self) -> &AtomicU32 {
        &self.lock
    }
    fn waiters_word(&self) -> &AtomicU32 {
        &self.waiters
    }
}

impl PipeRing {

    /// Bytes in the ring, or `Corrupt`.
    pub fn used(&self) -> Result<usize, Blocked> {
        let n = self.tail.load(SeqCst).wrapping_sub(self.head.load(SeqCst)) as usize;
        if n > PIPE_CAPACITY {
            Err(Blocked::Corrupt)
        } else {
            Ok(n)
        }
    }

    /// Start empty: a new pipe (the lock too), or, with the lock held, a
    /// corrupt one (`unlocked` false: the holder releases it).
    pub fn reset(&self, unlocked: bool) {
        let t = self.tail.load(SeqCst);
        self.head.store(t, SeqCst);
        if unlocked {
            self.lock.store(0, SeqCst);
        }
    }

    /// With the lock held: move up to `out.len()` bytes out. `Wait` if the
    /// ring is empty.
    pub fn take(&self, out: &mut [u8]) -> Result<usize, Blocked> {
        let used = self.used()?;
        let n = used.min(out.len());
        if n == 0 {
            return if out.is_empty() { Ok(0) } else { Err(Blocked::Wait) };
        }
        let head = self.head.load(Relaxed);
        for (i, b) in out[..n].iter_mut().enumerate() {
            *b = self.data[(head as usize + i) % PIPE_CAPACITY].load(Relaxed);
        }
        self.head.store(head.wrapping_add(n as u32), SeqCst);
        Ok(n)
    }

    /// With the lock held: move as much of `data` in as fits — all of it
    /// or nothing for up to [`PIPE_BUF`] bytes (atomic writes). `Wait` if
    /// nothing could go in.
    pub fn put(&self, data: &[u8]) -> Result<usize, Blocked> {
        let space = PIPE_CAPACITY - self.used()?;
        let n = if data.len() <= PIPE_BUF && data.len() > space { 0 } else { data.len().min(space) };
        if n == 0 {
            return if data.is_empty() { Ok(0) } else { Err(Blocked::Wait) };
        }
        let tail = self.tail.load(Relaxed);
        for (i, &b) in data[..n].iter().enumerate() {
            self.data[(tail as usize + i) % PIPE_CAPACITY].store(b, Relaxed);
        }
        self.tail.store(tail.wrapping_add(n as u32), SeqCst);
        Ok(n)
    }
}

/// Why a receive did not take a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoMessage {
    /// None of the wanted type.
    Wait,
    /// The first that matches is longer than the buffer (and truncation
    /// was not asked for).
    TooBig,
    /// The queue's bookkeeping makes no sense.
    Corrupt,
}

impl QueueRing {
    /// Empty, for queue `id` (a monitor making it, or starting a corrupt one
    /// over; with the lock held, `unlocked` false, the holder releases it).
    pub fn reset(&self, id: u64, unlocked: bool) {
        self.count.store(0, SeqCst);
        self.bytes.store(0, SeqCst);
        self.id.store(id, SeqCst);
        self.live.store(1, SeqCst);
        if unlocked {
            self.waiters.store(0, SeqCst);
            self.lock.store(0, SeqCst);
        }
    }

    /// This ring serves queue `id` (a hint: the monitor decides).
    pub fn serves(&self, id: u64) -> bool {
        self.live.load(Acquire) == 1 && self.id.load(Acquire) == id
    }

    /// (messages, bytes), checked.
    fn sizes(&self) -> Option<(usize, usize)> {
        let (n, b) = (self.count.load(Relaxed) as usize, self.bytes.load(Relaxed) as usize);
        (n <= QUEUE_MESSAGES && b <= QUEUE_BYTES).then_some((n, b))
    }

    /// With the lock held: queue `data` with type `mtype` (> 0, checked by
    /// the caller with the length). `Wait` while it does not fit.
    pub fn send(&self, mtype: i64, data: &[u8]) -> Result<(), Blocked> {
        let (n, bytes) = self.sizes().ok_or(Blocked::Corrupt)?;
        if n >= QUEUE_MESSAGES || bytes + data.len() > QUEUE_BYTES || data.len() > MSG_MAX {
            return Err(Blocked::Wait);
        }
        for (i, &b) in data.iter().enumerate() {
            self.data[bytes + i].store(b, Relaxed);
        }
        self.types[n].store(mtype, Relaxed);
        self.lens[n].store(data.len() as u32, Relaxed);
        self.bytes.store((bytes + data.len()) as u32, SeqCst);
        self.count.store(n as u32 + 1, SeqCst);
        Ok(())
    }

    /// With the lock held: take the first message of type `msgtyp` (0: any;
    /// > 0: that type; < 0: the lowest type up to its absolute value) into
    /// `out`, truncated if `truncate`: (its length as copied, its type).
    pub fn receive(&self, msgtyp: i64, out: &mut [u8], truncate: bool) -> Result<(usize, i64), NoMessage> {
        let (n, bytes) = self.sizes().ok_or(NoMessage::Corrupt)?;
        let ty = |i: usize| self.types[i].load(Relaxed);
        let pick = match msgtyp {
            0 => (n > 0).then_some(0),
            t if t > 0 => (0..n).find(|&i| ty(i) == t),
            t => {
                let lim = t.checked_neg().unwrap_or(i64::MAX);
                (0..n).filter(|&i| ty(i) <= lim).min_by_key(|&i| ty(i))
            }
        }
        .ok_or(NoMessage::Wait)?;
        let len_of = |i: usize| self.lens[i].load(Relaxed) as usize;
        let (off, len, mtype) = ((0..pick).map(len_of).sum::<usize>(), len_of(pick), ty(pick));
        if len > MSG_MAX || off + len > bytes || mtype <= 0 {
            return Err(NoMessage::Corrupt);
        }
        if len > out.len() && !truncate {
            return Err(NoMessage::TooBig);
        }
        let got = len.min(out.len());
        for (i, b) in out[..got].iter_mut().enumerate() {
            *b = self.data[off + i].load(Relaxed);
        }
        for i in off..bytes - len {
            self.data[i].store(self.data[i + len].load(Relaxed), Relaxed);
        }
        for i in pick..n - 1 {
            self.types[i].store(ty(i + 1), Relaxed);
            self.lens[i].store(len_of(i + 1) as u32, Relaxed);
        }
        self.bytes.store((bytes - len) as u32, SeqCst);
        self.count.store(n as u32 - 1, SeqCst);
        Ok((got, mtype))
    }
}

impl Rings {
    /// The cell of the member with family pid `fpid`, if the page names one.
    pub fn cell_of(&self, fpid: i32) -> Option<&Cell> {
        self.cells.iter().find(|c| fpid > 0 && c.fpid.load(Acquire) == fpid)
    }
}

impl Cell {
    /// Mark signal `sig` (1..=63) pending; true if the member sleeps in its
    /// monitor (the sender then wakes it).
    pub fn raise(&self, sig: u32) -> bool {
        self.signals.fetch_or(1 << (sig & 63), SeqCst);
        self.parked.load(SeqCst) != 0
    }

    /// Take the pending signals (bit 0 means nothing and is dropped).
    pub fn take(&self) -> u64 {
        if self.signals.load(Relaxed) == 0 {
            return 0;
        }
        self.signals.swap(0, SeqCst) & !1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> &'static PipeRing {
        // Zeroed atomics are a valid ring; leak one per test.
        extern crate std;
        let b: std::boxed::Box<PipeRing> = std::boxed::Box::new(PipeRing {
            lock: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
            closed: AtomicU32::new(0),
            _pad: [0; 11],
            data: [const { AtomicU8::new(0) }; PIPE_CAPACITY],
        });
        std::boxed::Box::leak(b)
    }

    #[test]
    fn bytes_come_out_as_they_went_in_across_the_wrap() {
        let r = ring();
        r.head.store(u32::MAX - 5, SeqCst);
        r.tail.store(u32::MAX - 5, SeqCst);
        let msg: [u8; 100] = core::array::from_fn(|i| i as u8);
        assert_eq!(r.put(&msg), Ok(100));
        let mut out = [0u8; 64];
        assert_eq!(r.take(&mut out), Ok(64));
        assert_eq!(&out[..], &msg[..64]);
        assert_eq!(r.take(&mut out), Ok(36));
        assert_eq!(&out[..36], &msg[64..]);
        assert_eq!(r.take(&mut out), Err(Blocked::Wait));
    }

    #[test]
    fn small_writes_are_all_or_nothing_and_large_ones_fill() {
        let r = ring();
        let big = [7u8; PIPE_CAPACITY - 10];
        assert_eq!(r.put(&big), Ok(PIPE_CAPACITY - 10));
        assert_eq!(r.put(&[1u8; 11]), Err(Blocked::Wait), "atomic: not split");
        assert_eq!(r.put(&[1u8; 10]), Ok(10));
        assert_eq!(r.put(&[1u8; 1]), Err(Blocked::Wait));
        let mut out = [0u8; PIPE_BUF + 100];
        assert_eq!(r.take(&mut out), Ok(PIPE_BUF + 100));
        assert_eq!(r.put(&[2u8; PIPE_BUF + 200]), Ok(PIPE_BUF + 100), "over PIPE_BUF: what fits");
    }

    #[test]
    fn positions_written_over_are_corrupt_not_a_crash() {
        let r = ring();
        r.tail.store(PIPE_CAPACITY as u32 + 1, SeqCst);
        assert_eq!(r.take(&mut [0u8; 8]), Err(Blocked::Corrupt));
        assert_eq!(r.put(b"x"), Err(Blocked::Corrupt));
        r.reset(true);
        assert_eq!(r.used(), Ok(0));
        assert_eq!(r.put(b"x"), Ok(1));
    }

    fn queue() -> &'static QueueRing {
        extern crate std;
        std::boxed::Box::leak(std::boxed::Box::new(QueueRing {
            lock: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            live: AtomicU32::new(0),
            count: AtomicU32::new(0),
            id: AtomicU64::new(0),
            bytes: AtomicU32::new(0),
            _pad: [0; 9],
            types: [const { AtomicI64::new(0) }; QUEUE_MESSAGES],
            lens: [const { AtomicU32::new(0) }; QUEUE_MESSAGES],
            data: [const { AtomicU8::new(0) }; QUEUE_BYTES],
        }))
    }

    #[test]
    fn messages_are_picked_by_type_as_system_v_says() {
        let q = queue();
        q.reset(0x105, true);
        assert!(q.serves(0x105) && !q.serves(0x205));
        for (t, m) in [(3, &b"three"[..]), (1, b"one"), (2, b"two"), (1, b"uno")] {
            q.send(t, m).unwrap();
        }
        let mut out = [0u8; 8];
        assert_eq!(q.receive(2, &mut out, false), Ok((3, 2)));
        assert_eq!(&out[..3], b"two");
        assert_eq!(q.receive(-2, &mut out, false), Ok((3, 1)), "lowest type up to 2: the first 1");
        assert_eq!(&out[..3], b"one");
        assert_eq!(q.receive(0, &mut [0u8; 2], false), Err(NoMessage::TooBig));
        assert_eq!(q.receive(0, &mut out[..2], true), Ok((2, 3)), "truncated");
        assert_eq!(&out[..2], b"th");
        assert_eq!(q.receive(7, &mut out, false), Err(NoMessage::Wait));
        assert_eq!(q.receive(0, &mut out, false), Ok((3, 1)));
        assert_eq!(&out[..3], b"uno");
        assert_eq!(q.receive(0, &mut out, false), Err(NoMessage::Wait));
    }

    #[test]
    fn a_full_queue_waits_and_a_spoilt_one_is_corrupt() {
        let q = queue();
        q.reset(1, true);
        let big = [9u8; MSG_MAX];
        assert_eq!(q.send(1, &big), Ok(()));
        assert_eq!(q.send(1, &big), Ok(()));
        assert_eq!(q.send(1, b"x"), Err(Blocked::Wait));
        q.lens[0].store(60_000, SeqCst);
        assert_eq!(q.receive(0, &mut [0u8; MSG_MAX], false), Err(NoMessage::Corrupt));
        q.count.store(1000, SeqCst);
        assert_eq!(q.send(1, b"x"), Err(Blocked::Corrupt));
    }

    #[test]
    fn the_lock_and_waiters() {
        let r = ring();
        assert!(r.try_lock(3));
        assert!(!r.try_lock(4));
        assert!(!r.unlock(true));
        r.waiters.store(WAIT_READER, SeqCst);
        assert!(r.try_lock(4));
        assert!(!r.unlock(false), "nothing moved: the sleepers wait on");
        assert!(r.try_lock(4));
        assert!(r.unlock(true), "sleepers to wake");
        assert!(!r.take_waiters());
    }
}
