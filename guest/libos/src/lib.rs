//! The wisp library OS. Linked with one application it forms a unikernel
//! image that the wisp monitor boots on KVM.
//!
//! Everything runs at CPL 3 on one vCPU with no interrupts: the library OS
//! reads its machine from the boot-info page, keeps time with `rdtsc`, and
//! talks to the monitor only through hypercalls (one `out` each) and, for a
//! NIC ([`net`], TCP/UDP on smoltcp), two shared-memory rings. An app
//! names its entry point with [`main!`], and with it, its manifest: the
//! features and devices it needs (checked by the monitor at load):
//!
//! ```ignore
//! #![no_std]
//! #![no_main]
//! wisp::main!(main);
//! fn main() -> i32 { wisp::println!("hi"); 0 }
//! // A server that needs a NIC and forks:
//! wisp::main!(serve, wisp::Manifest::new().features(wisp::features::FORK).nic(true));
//! ```
#![no_std]

// A host build (`cargo build -p APP` without the guest target) would fail
// later with a linker error about `_start`; say what to do instead.
#[cfg(not(all(target_arch = "x86_64", target_os = "none")))]
compile_error!(
    "wisp-libos builds only for the guest target: build the app with `wisp build [PATH]` \
     (or `cargo build --release --target x86_64-unknown-none`); see docs/libos.md"
);

extern crate alloc;

/// Hash maps and sets (`alloc` has only B-tree ones): hashbrown's, with
/// its default hasher.
pub mod collections {
    pub use hashbrown::{hash_map, hash_set, HashMap, HashSet};
}

pub mod blk;
pub mod console;
pub mod env;
pub mod exec;
pub mod family;
pub mod fs;
mod global;
pub mod heap;
#[path = "library.rs"]
pub mod lib;
pub mod hypercall;
pub mod net;
pub mod process;
mod rings;
mod signals;
mod start;
pub mod stdin;
pub mod time;

pub use process::{exit, ExitCode};

/// Say the app is ready: what it did so far (loading, warming caches) is
/// what every start needs again. A VM being made into a template (`wisp
/// run --template`) is saved here, and each VM started from the template
/// goes on from this call's return, in a fresh copy of the memory it had.
/// Elsewhere the call does nothing. The image must declare it:
/// `wisp::main!(main, wisp::Manifest::new().features(wisp::features::READY))`
/// (else it returns `Err(ENOSYS)`). State every instance must have of its
/// own (random seeds, identifiers) is made after it.
pub fn ready() -> Result<(), i64> {
    match hypercall::ready() {
        0 => Ok(()),
        e => Err(-e),
    }
}
pub use wisp_abi as abi;
pub use wisp_abi::features;
/// The image manifest [`main!`] takes (`wisp_abi::manifest`).
pub use wisp_abi::ImageNote as Manifest;
pub use wisp_abi::libpolicy::{loader, LibPolicy};

/// Declare the application's entry point — a function taking no arguments
/// and returning `()`, an `i32` exit code or `Result<(), E: Display>`
/// ([`ExitCode`]) — and the image's manifest (a `const` [`Manifest`]:
/// features and devices; none if left out), which goes into the image's
/// ABI note with the `stdio` feature every image has.
#[macro_export]
macro_rules! main {
    ($f:path) => {
        $crate::main!($f, $crate::Manifest::new());
    };
    ($f:path, $manifest:expr) => {
        #[no_mangle]
        extern "Rust" fn __wisp_main() -> i32 {
            $crate::ExitCode::code($f())
        }

        // The ABI note with the manifest, read by the monitor at load
        // (an ELF note section: the linker keeps it and makes it PT_NOTE).
        // (Every image has standard error and input: `stdio`.)
        #[used]
        #[link_section = ".note.wisp"]
        static __WISP_NOTE: $crate::abi::manifest::Note =
            $crate::abi::manifest::Note::new(($manifest).features($crate::features::STDIO));
    };
}

/// The image's policy for the shared libraries it may be given (a `const`
/// [`LibPolicy`]: signers trusted, lowest version, who may supply one —
/// `docs/libraries.md` "Restrictions"), in a second ELF note the monitor
/// checks every library against before it maps one. Without it, any
/// library from anyone.
///
/// ```ignore
/// wisp::lib_policy!(wisp::LibPolicy::new().key("ea4a…").min_version(1, 0, 0).loaders(wisp::loader::NAMED));
/// ```
#[macro_export]
macro_rules! lib_policy {
    ($policy:expr) => {
        #[used]
        #[link_section = ".note.wisp"]
        static __WISP_LIB_POLICY: $crate::abi::libpolicy::PolicyNote = $crate::abi::libpolicy::PolicyNote::new($policy);
    };
}
