//! The guest-physical memory map. Guest virtual addresses equal guest physical
//! addresses (identity mapping built by the monitor).
//!
//! ```text
//! 0x0000_0000  null page              unmapped (catches null dereferences)
//! 0x0000_1000  boot-info page         user, read-only
//! 0x0000_2000  GDT + TSS + I/O bitmap supervisor
//! 0x0000_3000  IDT                    supervisor
//! 0x0000_4000  exception stubs        supervisor, executable (CPL 0)
//! 0x0000_5000  exception stack        supervisor
//! 0x0000_6000  page tables            supervisor (PML4, PDPT, PDs, PT)
//! 0x0000_e000  prefault page          user, read-only, executable: the
//!              monitor's code that touches a preloaded image's pages in a
//!              pooled shell before any request (the guest never needs it)
//! 0x0001_0000  stack guard            unmapped (catches stack overflow)
//! 0x0002_0000  stack                  user, read/write, no-exec; grows down from 0x10_0000
//! 0x0010_0000  image                  user, per-segment permissions
//! image end    heap                   user, read/write, up to the end of RAM
//! 0x1_0000_0000 shared-memory window  user, read/write, no-exec; only the
//!              segments a VM attached (`shmat`) are backed, the rest faults
//! 0x1_1000_0000 family IPC page       user, read/write, no-exec, 2 MiB; backed
//!              once the guest asked for it (`family::rings`)
//! 0x1_4000_0000 library window         shared libraries the monitor mapped, each
//!              in a slot of [`LIB_SLOT`] bytes, its 2 MiB pages with its
//!              segments' permissions (page directory at [`LIB_PD`])
//! ```
//!
//! The first 2 MiB are mapped with 4 KiB pages so each system page and each
//! image segment gets its own permissions; the rest of RAM with 2 MiB pages.

/// Size of a small page.
pub const PAGE_SIZE: u64 = 0x1000;
/// Size of a large page.
pub const LARGE_PAGE_SIZE: u64 = 0x20_0000;

/// Guest-physical address of the boot-info page.
pub const BOOT_INFO: u64 = 0x1000;
/// GDT (and, at [`TSS`], the TSS with its I/O-permission bitmap).
pub const GDT: u64 = 0x2000;
/// Task-state segment, inside the GDT page.
pub const TSS: u64 = 0x2800;
/// Interrupt descriptor table.
pub const IDT: u64 = 0x3000;
/// Exception entry stubs (monitor-written code, runs at CPL 0).
pub const EXCEPTION_STUBS: u64 = 0x4000;
/// Bytes per exception stub.
pub const EXCEPTION_STUB_SIZE: u64 = 16;
/// Exception stack page; its top is the TSS `rsp0`.
pub const EXCEPTION_STACK: u64 = 0x5000;
/// PML4 table.
pub const PML4: u64 = 0x6000;
/// Page-directory-pointer table.
pub const PDPT: u64 = 0x7000;
/// First page directory; [`MAX_PDS`] consecutive pages.
pub const PD: u64 = 0x8000;
/// Page directories reserved (each maps 1 GiB).
pub const MAX_PDS: u64 = 4;
/// Page table for the first 2 MiB (4 KiB pages).
pub const PT0: u64 = 0xC000;
/// Page directory of the shared-memory window (2 MiB pages).
pub const SHM_PD: u64 = 0xD000;
/// The monitor's prefault page: code that touches the pages listed after
/// it ([`PREFAULT_LIST`]), run in a pooled shell that holds a preloaded
/// image, before any request (so the guest's first accesses fault no more).
pub const PREFAULT_PAGE: u64 = 0xE000;
/// Where in the prefault page its list of pages starts.
pub const PREFAULT_LIST: u64 = PREFAULT_PAGE + 0x40;

/// Guest address of the family shared-memory window: segment `s` attached
/// with `shmat` is at `SHM_BASE + offset(s)` in every VM of the family.
pub const SHM_BASE: u64 = 1 << 32;
/// Size of the shared-memory window (all of a family's segments together).
pub const SHM_SIZE: u64 = 256 << 20;
/// Guest address of the library window (`DeviceKind::Library`).
pub const LIB_BASE: u64 = 5 << 30;
/// Size of the library window (one page directory).
pub const LIB_SIZE: u64 = 1 << 30;
/// Address space each library gets in the window (the most a library's
/// segments may span).
pub const LIB_SLOT: u64 = 64 << 20;
/// Page directory of the library window (2 MiB pages), written by the
/// monitor when it maps a library.
pub const LIB_PD: u64 = 0xF000;
/// Lowest address of the unmapped stack guard region.
pub const STACK_GUARD: u64 = 0x1_0000;
/// Lowest address of the stack (the stack grows down towards it).
pub const STACK_BOTTOM: u64 = 0x2_0000;
/// Initial stack pointer.
pub const STACK_TOP: u64 = 0x10_0000;
/// Lowest address an image segment may be loaded at.
pub const IMAGE_BASE: u64 = 0x10_0000;

/// Smallest guest RAM the monitor accepts.
pub const MIN_MEM: u64 = 2 * LARGE_PAGE_SIZE;
/// Largest guest RAM the monitor accepts (limited by the page directories
/// reserved above and by 32-bit hypercall argument addresses).
pub const MAX_MEM: u64 = MAX_PDS << 30;
/// Heap the monitor guarantees above the image: a guest RAM size that leaves
/// less than this after the image is "memory too small".
pub const MIN_HEAP: u64 = 256 * 1024;

/// Round `x` up to a multiple of `align` (a power of two).
pub const fn align_up(x: u64, align: u64) -> u64 {
    (x + align - 1) & !(align - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_pages_do_not_overlap() {
        let pages = [BOOT_INFO, GDT, IDT, EXCEPTION_STUBS, EXCEPTION_STACK, PML4, PDPT];
        for w in pages.windows(2) {
            assert!(w[0] + PAGE_SIZE <= w[1]);
        }
        assert!(PD + MAX_PDS * PAGE_SIZE <= PT0);
        assert!(PT0 + PAGE_SIZE <= SHM_PD && SHM_PD + PAGE_SIZE <= PREFAULT_PAGE);
        assert!(PREFAULT_PAGE + PAGE_SIZE <= STACK_GUARD && PREFAULT_LIST < PREFAULT_PAGE + PAGE_SIZE);
        assert!(MAX_MEM <= SHM_BASE && SHM_SIZE <= 1 << 30);
        assert!(TSS > GDT && TSS < GDT + PAGE_SIZE);
        assert!(STACK_BOTTOM < STACK_TOP && STACK_TOP <= IMAGE_BASE);
        assert!(EXCEPTION_STUB_SIZE * 32 <= PAGE_SIZE);
    }

    #[test]
    fn align() {
        assert_eq!(align_up(0, 4096), 0);
        assert_eq!(align_up(1, 4096), 4096);
        assert_eq!(align_up(4096, 4096), 4096);
    }
}
