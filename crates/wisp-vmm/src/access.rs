//! What the guest itself may read and write: the user pages of the page
//! tables the monitor built for it. The monitor writes guest RAM from the
//! host side, where no page-table permission applies, so every buffer a
//! guest names in a hypercall (argument blocks, console data, pipe and
//! queue buffers) is checked here first: a guest must not be able to have
//! the monitor write its exception stubs, page tables, descriptor tables,
//! boot-info page or read-only code for it (and then run code at CPL 0), nor
//! read the monitor's pages through it.

/// Guest-physical ranges the guest may access, sorted and merged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserMap {
    /// `(start, end, writable)`; every listed range is readable.
    ranges: Vec<(u64, u64, bool)>,
}

impl UserMap {
    /// Add `[start, end)` (readable; `writable` too if set). Ranges must be
    /// added in ascending order; adjacent ranges of the same kind merge.
    pub(crate) fn push(&mut self, start: u64, end: u64, writable: bool) {
        if start >= end {
            return;
        }
        match self.ranges.last_mut() {
            Some(last) if last.1 == start && last.2 == writable => last.1 = end,
            _ => self.ranges.push((start, end, writable)),
        }
    }

    /// True if the guest may read all of `[addr, addr + len)`.
    pub fn readable(&self, addr: u64, len: u64) -> bool {
        self.covers(addr, len, false)
    }

    /// True if the guest may write all of `[addr, addr + len)`.
    pub fn writable(&self, addr: u64, len: u64) -> bool {
        self.covers(addr, len, true)
    }

    fn covers(&self, addr: u64, len: u64, write: bool) -> bool {
        let Some(end) = addr.checked_add(len) else { return false };
        let mut at = addr;
        // Ranges are sorted: walk the ones overlapping [addr, end).
        let first = self.ranges.partition_point(|r| r.1 <= addr);
        for &(s, e, w) in &self.ranges[first..] {
            if at >= end || s > at || (write && !w) {
                break;
            }
            at = e;
        }
        at >= end && (len > 0 || self.ranges.get(first).is_some_and(|r| r.0 <= addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_cover() {
        let mut m = UserMap::default();
        m.push(0x1000, 0x2000, false); // boot info
        m.push(0x20000, 0x100000, true); // stack
        m.push(0x100000, 0x104000, false); // code
        m.push(0x104000, 0x106000, true); // data
        m.push(0x106000, 0x200000, true); // heap: merges with data
        assert_eq!(m.ranges.len(), 4);
        assert!(m.readable(0x1000, 8));
        assert!(!m.writable(0x1000, 8));
        assert!(!m.readable(0x2000, 8), "GDT");
        assert!(!m.readable(0x1ff8, 16), "straddles into the GDT");
        assert!(m.readable(0xff000, 0x2000), "stack into code");
        assert!(!m.writable(0xff000, 0x2000), "stack into code");
        assert!(m.writable(0x104000, 0xfc000));
        assert!(!m.writable(0x104000, 0xfc001), "past RAM");
        assert!(!m.readable(u64::MAX - 4, 16), "wraps");
        assert!(m.readable(0x104000, 0));
        assert!(!m.readable(0x4000, 0), "empty, but in the stubs");
    }
}
