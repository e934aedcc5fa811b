//! x86-64 machine state the monitor builds for a guest: identity-mapped page
//! tables, a GDT with CPL-3 segments and a TSS whose I/O-permission bitmap
//! opens only the hypercall ports, an IDT whose CPL-0 stubs report every
//! exception to the monitor, and the initial registers.
//!
//! The guest never runs at CPL 0 in its normal path and cannot modify any of
//! this: all these pages are supervisor-only. (Under PVM-backed KVM, CPL-0
//! code is emulated; the stubs run only when the guest has already failed.)
//! The guest runs with IOPL 0: privileged instructions including `cli`/`sti`
//! fault, and port I/O is allowed only on the hypercall window through the
//! TSS bitmap, identically on bare-metal and PVM-backed KVM.

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use wisp_abi::layout::*;
use wisp_abi::bootinfo::MAX_DEVICES;
use wisp_abi::{DOORBELL_PORT_BASE, FAULT_PORT, HYPERCALL_PORT_BASE, HYPERCALL_PORT_COUNT};

use crate::access::UserMap;
use crate::error::Result;
use crate::image::{Image, PF_W, PF_X};
use crate::memory::GuestRam;

const P: u64 = 1;
const RW: u64 = 1 << 1;
const US: u64 = 1 << 2;
const PS: u64 = 1 << 7;
const NX: u64 = 1 << 63;

const SEL_KCODE: u16 = 0x08;
const SEL_UCODE: u16 = 0x18 | 3;
const SEL_UDATA: u16 = 0x20 | 3;
const SEL_TSS: u16 = 0x28;
const GDT_ENTRIES: u64 = 7;

/// Doorbell ports, one per possible device.
const DOORBELLS: std::ops::Range<u16> = DOORBELL_PORT_BASE..DOORBELL_PORT_BASE + MAX_DEVICES as u16;

/// Bytes of I/O-permission bitmap: one bit per port up to the last
/// doorbell, then the mandatory 0xff terminator byte.
const IOMAP_BYTES: u64 = (DOORBELLS.end as u64).div_ceil(8);
const TSS_BASE_SIZE: u64 = 104;
const TSS_LIMIT: u64 = TSS_BASE_SIZE + IOMAP_BYTES; // includes the terminator byte

/// Exceptions that push an error code.
pub const fn has_error_code(vector: u8) -> bool {
    matches!(vector, 8 | 10..=14 | 17 | 21 | 29 | 30)
}

/// Write the image-independent system pages: GDT, TSS, IDT, exception stubs,
/// and the upper levels of the page tables for `ram`'s size.
pub fn write_system_pages(ram: &GuestRam) -> Result<()> {
    // GDT: null, kernel code, kernel data, user code, user data, TSS (2 slots).
    let tss_desc_lo = (TSS_LIMIT & 0xffff)
        | ((TSS & 0xff_ffff) << 16)
        | (0x89 << 40)
        | (((TSS_LIMIT >> 16) & 0xf) << 48)
        | (((TSS >> 24) & 0xff) << 56);
    let gdt: [u64; GDT_ENTRIES as usize] = [
        0,
        0x0020_9a00_0000_0000,
        0x0000_9200_0000_0000,
        0x0020_fa00_0000_0000,
        0x0000_f200_0000_0000,
        tss_desc_lo,
        TSS >> 32,
    ];
    ram.write(GDT, &u64s(&gdt))?;

    // TSS: rsp0 = top of the exception stack; I/O bitmap right after the TSS.
    let mut tss = vec![0u8; (TSS_LIMIT + 1) as usize];
    tss[4..12].copy_from_slice(&(EXCEPTION_STACK + PAGE_SIZE).to_le_bytes());
    tss[102..104].copy_from_slice(&(TSS_BASE_SIZE as u16).to_le_bytes());
    let bitmap = &mut tss[TSS_BASE_SIZE as usize..];
    bitmap.fill(0xff);
    for port in (HYPERCALL_PORT_BASE..HYPERCALL_PORT_BASE + HYPERCALL_PORT_COUNT).chain(DOORBELLS) {
        bitmap[port as usize / 8] &= !(1 << (port % 8));
    }
    ram.write(TSS, &tss)?;

    // Exception stubs (CPL 0): mov dx, FAULT_PORT; mov al, vector; out dx, al; jmp $.
    // IDT: 32 interrupt gates (DPL 0, so `int n` from CPL 3 faults too).
    let mut stubs = vec![0u8; PAGE_SIZE as usize];
    let mut idt = Vec::with_capacity(64);
    for v in 0u8..32 {
        let at = v as usize * EXCEPTION_STUB_SIZE as usize;
        let [lo, hi] = FAULT_PORT.to_le_bytes();
        stubs[at..at + 9].copy_from_slice(&[0x66, 0xba, lo, hi, 0xb0, v, 0xee, 0xeb, 0xfe]);
        let off = EXCEPTION_STUBS + at as u64;
        idt.push((off & 0xffff) | ((SEL_KCODE as u64) << 16) | (0x8e << 40) | (((off >> 16) & 0xffff) << 48));
        idt.push(off >> 32);
    }
    ram.write(EXCEPTION_STUBS, &stubs)?;
    ram.write(IDT, &u64s(&idt))?;

    // Page tables, upper levels. Entries are permissive (user, writable);
    // the leaf entries decide.
    ram.write(PML4, &u64s(&[PDPT | P | RW | US]))?;
    let gib = ram.size().div_ceil(1 << 30);
    let pdpt: Vec<u64> = (0..gib).map(|i| (PD + i * PAGE_SIZE) | P | RW | US).collect();
    ram.write(PDPT, &u64s(&pdpt))?;
    // The family shared-memory window: mapped once, backed (by KVM memory
    // slots) only where the VM attached a segment; elsewhere an access exits
    // as MMIO and stops the VM.
    // The family's IPC page follows it, one more 2 MiB page (backed once the
    // guest asked for it: `wisp_abi::family::op::RINGS`).
    ram.write(PDPT + (SHM_BASE >> 30) * 8, &u64s(&[SHM_PD | P | RW | US]))?;
    const _: () = assert!(wisp_abi::family::rings::RINGS_GPA == SHM_BASE + SHM_SIZE);
    let shm: Vec<u64> = (0..SHM_SIZE / LARGE_PAGE_SIZE + 1)
        .map(|i| (SHM_BASE + i * LARGE_PAGE_SIZE) | P | RW | US | PS | NX)
        .collect();
    ram.write(SHM_PD, &u64s(&shm))?;
    Ok(())
}

/// Write the leaf page tables for `image` loaded in `ram`: 4 KiB pages with
/// per-page permissions in the first 2 MiB, 2 MiB pages above. Returns the
/// guest's own view of RAM (its user pages), read from those tables.
pub fn map_image(ram: &GuestRam, image: &Image) -> Result<UserMap> {
    let image_end = image.end();
    let perm = |addr: u64, len: u64| -> u64 {
        // Union of the permissions of the segments touching [addr, addr+len).
        let mut w = false;
        let mut x = false;
        let mut any = false;
        for s in image.segments.iter().filter(|s| s.vaddr < addr + len && s.end() > addr) {
            any = true;
            w |= s.flags & PF_W != 0;
            x |= s.flags & PF_X != 0;
        }
        if !any {
            return RW | NX; // heap
        }
        (if w { RW } else { 0 }) | (if x { 0 } else { NX })
    };
    let mut pt0 = vec![0u64; 512];
    for (i, e) in pt0.iter_mut().enumerate() {
        let a = i as u64 * PAGE_SIZE;
        *e = match a {
            BOOT_INFO => a | P | US | NX,
            PREFAULT_PAGE => a | P | US,
            EXCEPTION_STUBS => a | P,
            GDT..=PT0 => a | P | RW | NX,
            _ if a < STACK_BOTTOM => 0,
            _ if a < IMAGE_BASE => a | P | RW | US | NX,
            _ if a < image_end => a | P | US | perm(a, PAGE_SIZE),
            _ => a | P | RW | US | NX,
        };
    }
    ram.write(PT0, &u64s(&pt0))?;
    let pages = ram.size() / LARGE_PAGE_SIZE;
    let mut pd = Vec::with_capacity(pages as usize);
    pd.push(PT0 | P | RW | US);
    for j in 1..pages {
        let a = j * LARGE_PAGE_SIZE;
        let x = if a < image_end { perm(a, LARGE_PAGE_SIZE) & NX } else { NX };
        pd.push(a | P | RW | US | PS | x);
    }
    ram.write(PD, &u64s(&pd))?;
    Ok(user_map(&pt0, &pd))
}

/// The leaf page tables in `ram`: the first 2 MiB's 512 entries and the
/// 2 MiB entries of RAM (what a snapshot carries).
pub fn leaf_tables(ram: &GuestRam) -> Result<(Vec<u64>, Vec<u64>)> {
    let read = |at: u64, n: u64| -> Result<Vec<u64>> {
        let mut b = vec![0u8; (n * 8) as usize];
        ram.read(at, &mut b)?;
        Ok(b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    };
    Ok((read(PT0, 512)?, read(PD, ram.size() / LARGE_PAGE_SIZE)?))
}

/// Write saved leaf page tables (a snapshot's) into `ram`, if they are
/// tables [`map_image`] could have written: the monitor's own pages as it
/// maps them, the stack region user read-write, and every other page
/// mapped to itself, user-accessible, with no bits but present, writable
/// and no-execute (2 MiB pages above), and the accessed and dirty bits the
/// CPU sets. Returns the guest's view of RAM.
pub fn restore_tables(ram: &GuestRam, pt0: &[u64], pd: &[u64]) -> std::result::Result<UserMap, String> {
    const ADDR: u64 = 0x000f_ffff_ffff_f000;
    // The CPU sets accessed and dirty bits as the guest runs.
    const AD: u64 = 1 << 5 | 1 << 6;
    if pt0.len() != 512 || pd.len() as u64 != ram.size() / LARGE_PAGE_SIZE {
        return Err(format!("page tables of {} and {} entries for {} MiB of RAM", pt0.len(), pd.len(), ram.size() >> 20));
    }
    for (i, &e) in pt0.iter().enumerate() {
        let a = i as u64 * PAGE_SIZE;
        let e = e & !AD;
        let fixed = match a {
            BOOT_INFO => Some(a | P | US | NX),
            PREFAULT_PAGE => Some(a | P | US),
            EXCEPTION_STUBS => Some(a | P),
            GDT..=PT0 => Some(a | P | RW | NX),
            _ if a < STACK_BOTTOM => Some(0),
            _ if a < IMAGE_BASE => Some(a | P | RW | US | NX),
            _ => None,
        };
        let ok = match fixed {
            Some(v) => e == v,
            None => e & ADDR == a && e & !(ADDR | P | RW | US | NX) == 0 && e & (P | US) == P | US,
        };
        if !ok {
            return Err(format!("page table entry for {a:#x} is {e:#x}, not one the monitor writes"));
        }
    }
    for (j, &e) in pd.iter().enumerate() {
        let a = j as u64 * LARGE_PAGE_SIZE;
        let e = e & !AD;
        let ok = if j == 0 { e == PT0 | P | RW | US } else { e & !NX == a | P | RW | US | PS };
        if !ok {
            return Err(format!("page directory entry for {a:#x} is {e:#x}, not one the monitor writes"));
        }
    }
    ram.write(PT0, &u64s(pt0)).map_err(|e| e.to_string())?;
    ram.write(PD, &u64s(pd)).map_err(|e| e.to_string())?;
    Ok(user_map(pt0, pd))
}

/// The user pages of the first 2 MiB (`pt0`) and of the 2 MiB pages above
/// (`pd`, entry 0 being `pt0` itself).
fn user_map(pt0: &[u64], pd: &[u64]) -> UserMap {
    let mut m = UserMap::default();
    let mut add = |addr: u64, size: u64, e: u64| {
        if e & (P | US) == P | US {
            m.push(addr, addr + size, e & RW != 0);
        }
    };
    for (i, &e) in pt0.iter().enumerate() {
        add(i as u64 * PAGE_SIZE, PAGE_SIZE, e);
    }
    for (j, &e) in pd.iter().enumerate().skip(1) {
        add(j as u64 * LARGE_PAGE_SIZE, LARGE_PAGE_SIZE, e);
    }
    m
}

/// Code run once by [`crate::Shell::warm_up`]: `mov dx, WARMUP_PORT;
/// out dx, al; jmp $`, at [`IMAGE_BASE`].
pub const WARMUP_CODE: [u8; 7] = [0x66, 0xba, 0x0f, 0x05, 0xee, 0xeb, 0xfe];
/// Port the warm-up code reports on (the last of the hypercall window,
/// never a hypercall).
pub const WARMUP_PORT: u16 = 0x50f;

/// Page tables for the warm-up run: the system pages and one user,
/// read-only, executable page at [`IMAGE_BASE`]. `map_image` replaces them.
pub fn map_warmup(ram: &GuestRam) -> Result<()> {
    let mut pt0 = vec![0u64; 512];
    for (i, e) in pt0.iter_mut().enumerate() {
        let a = i as u64 * PAGE_SIZE;
        *e = match a {
            EXCEPTION_STUBS => a | P,
            GDT..=PT0 => a | P | RW | NX,
            IMAGE_BASE => a | P | US,
            _ => 0,
        };
    }
    ram.write(PT0, &u64s(&pt0))?;
    ram.write(PD, &u64s(&[PT0 | P | RW | US]))?;
    ram.write(IMAGE_BASE, &WARMUP_CODE)
}

/// The prefault code (at [`PREFAULT_PAGE`], run at CPL 3 with the image's
/// own page tables): for each of `rcx` (at least one) entries at `rsi` (a
/// page's address, bit 0 set to write), read a byte of the page, or write
/// one back unchanged; then report on [`WARMUP_PORT`].
///
/// ```text
///  0: mov rax, [rsi]      3: add rsi, 8          7: btr rax, 0
/// 12: jnc 19             14: or byte [rax], 0   17: jmp 21
/// 19: mov dl, [rax]      21: dec rcx            24: jnz 0
/// 26: mov dx, WARMUP_PORT                       30: out dx, al   31: jmp $
/// ```
pub const PREFAULT_CODE: [u8; 33] = [
    0x48, 0x8b, 0x06, 0x48, 0x83, 0xc6, 0x08, 0x48, 0x0f, 0xba, 0xf0, 0x00, 0x73, 0x05, 0x80, 0x08, 0x00, 0xeb, 0x02,
    0x8a, 0x10, 0x48, 0xff, 0xc9, 0x75, 0xe6, 0x66, 0xba, 0x0f, 0x05, 0xee, 0xeb, 0xfe,
];

/// Most pages one prefault run touches (the list fills the rest of its page).
pub const PREFAULT_MAX: usize = ((PAGE_SIZE - (PREFAULT_LIST - PREFAULT_PAGE)) / 8) as usize;

/// Write the prefault code and its list of `(page, write)` into RAM, and
/// return the registers that run it. `pages` is cut to [`PREFAULT_MAX`]; an
/// empty list touches the prefault page itself.
pub fn prefault(ram: &GuestRam, pages: &[(u64, bool)]) -> Result<kvm_regs> {
    let mut list: Vec<u64> = pages.iter().take(PREFAULT_MAX).map(|&(a, w)| (a & !(PAGE_SIZE - 1)) | w as u64).collect();
    if list.is_empty() {
        list.push(PREFAULT_PAGE);
    }
    ram.write(PREFAULT_PAGE, &PREFAULT_CODE)?;
    ram.write(PREFAULT_LIST, &u64s(&list))?;
    Ok(kvm_regs { rip: PREFAULT_PAGE, rsp: STACK_TOP, rsi: PREFAULT_LIST, rcx: list.len() as u64, rflags: 0x2, ..Default::default() })
}

/// Special registers for long mode at CPL 3 with this module's tables.
pub fn set_sregs(s: &mut kvm_sregs) {
    s.cr0 = 0x8001_0033; // PG | WP | NE | ET | MP | PE
    s.cr3 = PML4;
    s.cr4 = 0x620; // OSXMMEXCPT | OSFXSR | PAE
    s.efer = 0xd00; // NXE | LMA | LME
    s.gdt.base = GDT;
    s.gdt.limit = (GDT_ENTRIES * 8 - 1) as u16;
    s.idt.base = IDT;
    s.idt.limit = 32 * 16 - 1;
    let code = kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: SEL_UCODE,
        type_: 11,
        present: 1,
        dpl: 3,
        db: 0,
        s: 1,
        l: 1,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    let data = kvm_segment { selector: SEL_UDATA, type_: 3, db: 1, l: 0, ..code };
    s.cs = code;
    s.ds = data;
    s.es = data;
    s.fs = data;
    s.gs = data;
    s.ss = data;
    s.tr = kvm_segment {
        base: TSS,
        limit: TSS_LIMIT as u32,
        selector: SEL_TSS,
        type_: 11,
        present: 1,
        dpl: 0,
        db: 0,
        s: 0,
        l: 0,
        g: 0,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
}

/// General registers at entry: `rdi` points at the boot-info page.
pub fn initial_regs(entry: u64) -> kvm_regs {
    kvm_regs { rip: entry, rsp: STACK_TOP, rdi: BOOT_INFO, rflags: 0x2, ..Default::default() }
}

fn u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The guest's CPUID: a fixed, small x86-64 baseline (the simplified virtual
/// architecture: the guest learns everything else from its boot-info page).
/// Built from the host's own `cpuid` instead of `KVM_GET_SUPPORTED_CPUID`,
/// which costs ~0.4 ms on PVM hosts; only features every x86-64 host has
/// and the guest can use at CPL 3 without setup are offered, masked with
/// what this host really has.
pub fn cpuid_entries() -> Vec<kvm_bindings::kvm_cpuid_entry2> {
    use std::arch::x86_64::__cpuid;
    let e = |function: u32, eax: u32, ebx: u32, ecx: u32, edx: u32| kvm_bindings::kvm_cpuid_entry2 {
        function,
        index: 0,
        flags: 0,
        eax,
        ebx,
        ecx,
        edx,
        ..Default::default()
    };
    #[allow(unused_unsafe)]
    // SAFETY: `cpuid` is available on every x86-64 CPU and has no side effects.
    let (l0, l1, x1) = unsafe { (__cpuid(0), __cpuid(1), __cpuid(0x8000_0001)) };
    // Leaf 1: FPU TSC PAE CX8 PGE CMOV PAT MMX FXSR SSE SSE2 | SSE3 SSSE3 CX16 SSE4.1 SSE4.2 POPCNT.
    let edx1 = l1.edx & (1 | 1 << 4 | 1 << 6 | 1 << 8 | 1 << 13 | 1 << 15 | 1 << 16 | 1 << 23 | 1 << 24 | 1 << 25 | 1 << 26);
    let ecx1 = (l1.ecx & (1 | 1 << 9 | 1 << 13 | 1 << 19 | 1 << 20 | 1 << 23)) | 1 << 31; // + hypervisor
    let sig = u32::from_le_bytes(*b"Wisp");
    vec![
        e(0, 1, l0.ebx, l0.ecx, l0.edx),
        // Family/model/stepping as the host; one logical CPU, no APIC.
        e(1, l1.eax, 0, ecx1, edx1),
        e(0x4000_0000, 0x4000_0000, sig, sig, sig),
        e(0x8000_0000, 0x8000_0001, 0, 0, 0),
        // LAHF | NX, LM.
        e(0x8000_0001, 0, 0, x1.ecx & 1, x1.edx & (1 << 20 | 1 << 29)),
    ]
}
