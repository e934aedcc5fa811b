//! The heap: all RAM above the image, handed to a linked-list allocator.

use linked_list_allocator::LockedHeap;

#[global_allocator]
static HEAP: LockedHeap = LockedHeap::empty();

pub(crate) fn init(start: u64, end: u64) {
    if end > start {
        // SAFETY: the monitor guarantees [heap_start, heap_end) is guest RAM
        // mapped read/write for this guest and used by nothing else; this is
        // called once, before any allocation.
        unsafe { HEAP.lock().init(start as *mut u8, (end - start) as usize) };
    }
}

/// Bytes of heap in use and free.
pub fn usage() -> (usize, usize) {
    let h = HEAP.lock();
    (h.used(), h.free())
}
