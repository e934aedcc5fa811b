//! The heap: all RAM above the image, handed to Talc (a dlmalloc-style
//! allocator with size-binned free lists: near-constant time however
//! fragmented the heap). It replaced a first-fit linked list whose search
//! grew with every hole: a TLS proxy making and dropping a few hundred
//! small allocations per connection got slower by the second (its
//! handshakes from 450 µs to over 1 ms in 15 s).
//!
//! Zeroed allocations skip the bytes no one has written yet: the monitor
//! hands the guest its RAM zeroed (fresh anonymous memory, or a forked
//! parent's, whose heap and whose `fresh` mark come along together), and
//! the allocator writes only inside blocks it hands out, in the few words
//! of metadata just past a block and at the start of each free run — at
//! most [`SLACK`] bytes past the highest block end so far — in its bins at
//! the heap's start, and in the size word at the very end of the heap (the
//! boundary tag of its top free run). So a socket's 256 KiB buffer costs
//! neither a `memset` nor host memory until its pages are used (the host
//! backs a guest page on first touch), and a listener can keep many such
//! sockets listening.

use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicUsize, Ordering};

use talc::{ErrOnOom, Span, Talc, Talck};

/// Bytes past the highest block end the allocator may write (a block's
/// tag and the next free run's header, a few words), with room to spare.
const SLACK: usize = 64;
/// Bytes at the end of the heap the allocator may write at any time (the
/// top free run's closing size word), with room to spare.
const TOP: usize = 64;
/// Bytes at the start of the heap the allocator writes when it takes it
/// (its bins, 128 words, and tags), with room to spare.
const METADATA: usize = 4096;

struct Heap {
    inner: Talck<spin::Mutex<()>, ErrOnOom>,
    /// No byte at or above `fresh + SLACK` was handed out or written, but
    /// for the heap's last [`TOP`] bytes.
    fresh: AtomicUsize,
    /// The heap's end.
    end: AtomicUsize,
}

impl Heap {
    /// Note a block handed out: `[p, p + size)`, and the allocator's tag
    /// after it.
    fn note(&self, p: *mut u8, size: usize) {
        if !p.is_null() {
            self.fresh.fetch_max(p as usize + size.max(16).next_multiple_of(8), Ordering::Relaxed);
        }
    }
}

// SAFETY: every call goes to Talc, a sound allocator; `alloc_zeroed`
// returns its block with every byte zero (those it does not clear were
// never written since the monitor zeroed them, per the module comment).
unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.inner.alloc(layout) };
        self.note(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on (Talc grows in place
        // when it can, which the default copy never does).
        let p = unsafe { self.inner.realloc(ptr, layout, new_size) };
        self.note(p, new_size);
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let fresh = self.fresh.load(Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.inner.alloc(layout) };
        if p.is_null() {
            return p;
        }
        let start = p as usize;
        let end = start + layout.size();
        let dirty_end = end.min(fresh.saturating_add(SLACK)).max(start);
        // SAFETY: `[start, dirty_end)` lies inside the block just handed out.
        unsafe { core::ptr::write_bytes(p, 0, dirty_end - start) };
        // The heap's top, where the allocator keeps a size word.
        let top = self.end.load(Ordering::Relaxed).saturating_sub(TOP).max(dirty_end);
        if end > top {
            // SAFETY: `[top, end)` lies inside the block just handed out.
            unsafe { core::ptr::write_bytes(top as *mut u8, 0, end - top) };
        }
        self.note(p, layout.size());
        p
    }
}

#[global_allocator]
static HEAP: Heap = Heap { inner: Talc::new(ErrOnOom).lock(), fresh: AtomicUsize::new(0), end: AtomicUsize::new(0) };

pub(crate) fn init(start: u64, end: u64) {
    if end > start {
        // Talc keeps its bins (1 KiB) at the heap's start, and the first
        // free run's header after them: written, as if handed out.
        HEAP.fresh.store((start as usize).saturating_add(METADATA).min(end as usize), Ordering::Relaxed);
        HEAP.end.store(end as usize, Ordering::Relaxed);
        // SAFETY: the monitor guarantees [heap_start, heap_end) is guest RAM
        // mapped read/write for this guest, zeroed, and used by nothing
        // else; this is called once, before any allocation.
        let claimed = unsafe { HEAP.inner.lock().claim(Span::new(start as *mut u8, end as *mut u8)) };
        if claimed.is_err() {
            crate::eprintln!("wisp: the heap ({} bytes) is too small to use", end - start);
        }
    }
}

/// A zeroed buffer of `len` bytes, or `None` if taking it would leave less
/// than `reserve` bytes of heap free (or none is left): for buffers a
/// program may do without, such as a new connection's, rather than the
/// allocation failure that ends the program. Its pages cost the host
/// nothing until they are written (see the module comment).
pub(crate) fn try_zeroed(len: usize, reserve: usize) -> Option<alloc::vec::Vec<u8>> {
    if len == 0 || usage().1 < len.saturating_add(reserve) {
        return None;
    }
    let layout = Layout::array::<u8>(len).ok()?;
    // SAFETY: `layout` has a non-zero size.
    let p = unsafe { HEAP.alloc_zeroed(layout) };
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is a block of `len` zeroed (initialised) bytes from the
    // global allocator with `u8`'s alignment: exactly what a `Vec<u8>` of
    // capacity `len` owns and frees.
    Some(unsafe { alloc::vec::Vec::from_raw_parts(p, len, len) })
}

/// Bytes of heap in use and free.
pub fn usage() -> (usize, usize) {
    let h = HEAP.inner.lock();
    let c = h.get_counters();
    (c.allocated_bytes, c.available_bytes)
}
