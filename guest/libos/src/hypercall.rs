//! Hypercalls: one `out dx, eax` each, with `eax` holding the guest-physical
//! address of the argument block (see the `wisp-abi` crate).

use core::arch::asm;

use wisp_abi::args;
use wisp_abi::Hypercall;

/// Issue hypercall `hc` with argument block `block`. The monitor may write
/// results back into `block` before the guest resumes.
#[inline(always)]
pub fn call<T>(hc: Hypercall, block: &mut T) {
    // Identity mapping: the virtual address is the guest-physical one, and
    // all guest RAM is below 4 GiB, so it fits in eax.
    let gpa = block as *mut T as u64 as u32;
    // SAFETY: `out` to a hypercall port is allowed at CPL 3 by the TSS I/O
    // bitmap; it does not touch the stack. No `nomem`: the monitor reads and
    // writes `block` while the instruction executes.
    unsafe {
        asm!("out dx, eax", in("dx") hc.port(), in("eax") gpa, options(nostack, preserves_flags));
    }
}

/// Write bytes to the console. Returns the number written.
pub fn console_write(data: &[u8]) -> i64 {
    let mut a = args::ConsoleWrite { data: data.as_ptr() as u64, len: data.len() as u64, ret: 0 };
    call(Hypercall::ConsoleWrite, &mut a);
    a.ret
}

/// The `stdio` hypercall: operation `op` (`wisp_abi::args::stdio_op`) on
/// `buf` (read from for a write, written to for a read). Returns bytes
/// moved or a negative errno.
pub fn stdio(op: u32, buf: *mut u8, len: usize) -> i64 {
    let mut a = args::Stdio { op, reserved: 0, data: buf as u64, len: len as u64, ret: 0 };
    call(Hypercall::Stdio, &mut a);
    a.ret
}

/// End the VM.
pub fn exit(code: i32) -> ! {
    let mut a = args::Exit { code, reserved: 0 };
    call(Hypercall::Exit, &mut a);
    // The monitor never resumes a guest after exit.
    loop {
        core::hint::spin_loop();
    }
}

/// The host's clocks: (nanoseconds since boot, wall-clock ns since the epoch).
pub fn clock() -> (u64, u64) {
    let mut a = args::Clock::default();
    call(Hypercall::Clock, &mut a);
    (a.monotonic_ns, a.wall_ns)
}

/// Say the guest is ready (the `ready` hypercall): 0, or `-ENOSYS` if the
/// image did not declare `features::READY`.
pub fn ready() -> i64 {
    let mut a = args::Ready::default();
    call(Hypercall::Ready, &mut a);
    a.ret
}

/// Park the vCPU for at most `timeout_ns` or until an event; returns the
/// pending event bits.
pub fn idle(timeout_ns: u64) -> u64 {
    // A scheduling point: a library update waiting is taken before the
    // park, or when it wakes the park.
    crate::lib::quiescent();
    let mut a = args::Idle { timeout_ns, events: 0 };
    call(Hypercall::Idle, &mut a);
    if a.events & wisp_abi::events::LIBRARY != 0 {
        crate::lib::quiescent();
    }
    a.events
}

/// Ring device `device`'s doorbell (its entry has the `DOORBELL` flag): a
/// kick with no argument block, which the monitor can have KVM deliver
/// without an exit.
#[inline(always)]
pub fn doorbell(device: u32) {
    let port = wisp_abi::DOORBELL_PORT_BASE + device as u16;
    // SAFETY: `out` to a doorbell port is allowed at CPL 3 by the TSS I/O
    // bitmap; it touches neither memory nor the stack.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") 0u8, options(nostack, nomem, preserves_flags));
    }
}

/// Kick device `device` (its index in the boot-info device table): for a
/// NIC, its TX ring has frames. Only needed while the NIC header's
/// `monitor_idle` is 1; the network stack issues at most one per poll.
pub fn notify(device: u32) {
    let mut a = args::Notify { device, reserved: 0 };
    call(Hypercall::Notify, &mut a);
}
