//! Entry point and the panic handler. (The image's ABI note and manifest
//! come from `wisp::main!`.)

use core::arch::global_asm;
use core::panic::PanicInfo;

use wisp_abi::BootInfo;

// Entered at CPL 3 with rsp at the top of the stack and rdi pointing at the
// boot-info page.
global_asm!(
    ".globl _start",
    "_start:",
    "and rsp, -16",
    "xor ebp, ebp",
    "call {start}",
    "ud2",
    start = sym wisp_start,
);

extern "Rust" {
    fn __wisp_main() -> i32;
}

extern "C" fn wisp_start(info: *const BootInfo) -> ! {
    // SAFETY: the monitor maps the boot-info page read-only at this address
    // before the first instruction and never changes it afterwards; it is
    // valid for the whole life of the guest.
    let info: &'static BootInfo = unsafe { &*info };
    crate::env::init(info);
    crate::heap::init(info.heap_start, info.heap_end);
    // SAFETY: `__wisp_main` is defined by the application through `wisp::main!`.
    let code = unsafe { __wisp_main() };
    crate::process::exit(code)
}

#[panic_handler]
fn panic(info: &PanicInfo) -> ! {
    crate::eprintln!("{}", info);
    crate::hypercall::exit(101)
}
