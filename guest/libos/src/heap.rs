//! The heap: all RAM above the image, handed to a linked-list allocator.
//!
//! Zeroed allocations skip the bytes no one has written yet: the monitor
//! hands the guest its RAM zeroed (fresh anonymous memory, or a forked
//! parent's, whose heap and whose `fresh` mark come along together), and
//! the allocator writes only inside blocks it hands out and in a 16-byte
//! hole header at the start of each free run — at most just past the
//! highest block end so far. So a socket's 256 KiB buffer costs neither a
//! `memset` nor host memory until its pages are used (the host backs a
//! guest page on first touch), and a listener can keep many such sockets
//! listening.

use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicUsize, Ordering};

use linked_list_allocator::LockedHeap;

/// Bytes past the highest block end the allocator may write (its hole
/// header, 16 bytes after an 8-byte alignment), with room to spare.
const SLACK: usize = 64;

struct Heap {
    inner: LockedHeap,
    /// No byte at or above `fresh + SLACK` was handed out or written.
    fresh: AtomicUsize,
}

impl Heap {
    /// Note a block handed out: `[p, p + size)`, rounded as the allocator
    /// rounds (at least 16 bytes, a multiple of 8).
    fn note(&self, p: *mut u8, size: usize) {
        if !p.is_null() {
            self.fresh.fetch_max(p as usize + size.max(16).next_multiple_of(8), Ordering::Relaxed);
        }
    }
}

// SAFETY: every call goes to `LockedHeap`, a sound allocator; `alloc_zeroed`
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

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let fresh = self.fresh.load(Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.inner.alloc(layout) };
        if p.is_null() {
            return p;
        }
        let start = p as usize;
        let dirty_end = (start + layout.size()).min(fresh.saturating_add(SLACK)).max(start);
        // SAFETY: `[start, dirty_end)` lies inside the block just handed out.
        unsafe { core::ptr::write_bytes(p, 0, dirty_end - start) };
        self.note(p, layout.size());
        p
    }
}

#[global_allocator]
static HEAP: Heap = Heap { inner: LockedHeap::empty(), fresh: AtomicUsize::new(0) };

pub(crate) fn init(start: u64, end: u64) {
    if end > start {
        HEAP.fresh.store(start as usize, Ordering::Relaxed);
        // SAFETY: the monitor guarantees [heap_start, heap_end) is guest RAM
        // mapped read/write for this guest, zeroed, and used by nothing
        // else; this is called once, before any allocation.
        unsafe { HEAP.inner.lock().init(start as *mut u8, (end - start) as usize) };
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
    (h.used(), h.free())
}
