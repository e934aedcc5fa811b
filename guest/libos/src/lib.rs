//! The wisp library OS. Linked with one application it forms a unikernel
//! image that the wisp monitor boots on KVM.
//!
//! Everything runs at CPL 3 on one vCPU with no interrupts: the library OS
//! reads its machine from the boot-info page, keeps time with `rdtsc`, and
//! talks to the monitor only through hypercalls (one `out` each) and, for a
//! NIC ([`net`], TCP/UDP on smoltcp), two shared-memory rings. An app
//! names its entry point with [`main!`]:
//!
//! ```ignore
//! #![no_std]
//! #![no_main]
//! wisp::main!(main);
//! fn main() -> i32 { wisp::println!("hi"); 0 }
//! ```
#![no_std]

extern crate alloc;

pub mod console;
pub mod env;
pub mod exec;
pub mod family;
mod global;
pub mod heap;
pub mod hypercall;
pub mod net;
pub mod process;
mod start;
pub mod time;

pub use process::{exit, ExitCode};
pub use wisp_abi as abi;

/// Declare the application's entry point: a function taking no arguments
/// and returning `()` or an `i32` exit code.
#[macro_export]
macro_rules! main {
    ($f:path) => {
        #[no_mangle]
        extern "Rust" fn __wisp_main() -> i32 {
            $crate::ExitCode::code($f())
        }
    };
}
