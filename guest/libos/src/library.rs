//! Shared libraries the monitor mapped for this VM (issue 17,
//! `docs/libraries.md`): found by name in the boot-info device table
//! (kind `Library`: its name, base and span), their symbols looked up
//! through their own hash tables (`dynlink`), and calls bound lazily:
//!
//! ```ignore
//! wisp::lib_fn!(hello, fn hello_version() -> u32);
//! let v = unsafe { hello_version() };   // looked up on the first call, then direct
//! ```
//!
//! Live update (`wisp update`): the monitor maps the new library beside the
//! old one and sets bit 0 of the boot-info page's `lib_state`; the library
//! OS answers at its next point where no frame of a library's code is on
//! the stack — before an outermost library call ([`enter`], which every
//! `lib_fn!` call goes through) or around an idle — with the `library`
//! hypercall, in which the monitor carries the variables over and switches
//! the entry. Addresses looked up in an older generation of `lib_state` are
//! stale: `lib_fn!` and `lib_var!` look theirs up again.

use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use wisp_abi::bootinfo::{BootInfo, DeviceKind};
use wisp_abi::layout::{BOOT_INFO, LIB_BASE, LIB_SIZE};

/// Library calls under way (a callback from a library into the app that
/// calls a library again nests): the old library is in use while > 0.
static DEPTH: AtomicU32 = AtomicU32::new(0);
/// TSC ticks the last switch held this VM (the `library` hypercall).
static LAST_SWITCH: AtomicU64 = AtomicU64::new(0);

/// `lib_state` of the boot-info page, as the monitor last wrote it.
fn lib_state() -> u32 {
    let at = (BOOT_INFO as usize + core::mem::offset_of!(BootInfo, lib_state)) as *const u32;
    // SAFETY: the boot-info page is mapped read-only for the VM's life; the
    // monitor changes this word while the guest runs (hence volatile).
    unsafe { at.read_volatile() }
}

/// The libraries' generation: it changes when a live update switched one.
pub fn generation() -> u32 {
    lib_state() >> 1
}

/// If an update waits and no library code is on the stack: take it now
/// (the `library` hypercall). Called at the library OS's scheduling points.
pub fn quiescent() {
    if lib_state() & 1 != 0 && DEPTH.load(Ordering::Relaxed) == 0 {
        let t = crate::time::rdtsc();
        let mut a = wisp_abi::args::Library { op: wisp_abi::args::library_op::SWITCH, reserved: 0, ret: 0 };
        crate::hypercall::call(wisp_abi::Hypercall::Library, &mut a);
        LAST_SWITCH.store(crate::time::rdtsc().wrapping_sub(t), Ordering::Relaxed);
    }
}

/// Nanoseconds the last live update held this VM (its whole `library`
/// hypercall, as the guest's own clock saw it; 0: none yet).
pub fn last_switch_ns() -> u64 {
    crate::time::ticks_ns(LAST_SWITCH.load(Ordering::Relaxed))
}

/// A library call begins (for [`crate::lib_fn!`]): an update waiting is
/// taken first if this is the outermost call.
pub fn enter() {
    quiescent();
    DEPTH.fetch_add(1, Ordering::Relaxed);
}

/// A library call ended.
pub fn leave() {
    DEPTH.fetch_sub(1, Ordering::Relaxed);
}

/// A library mapped for this VM.
pub struct Library {
    base: u64,
    map: dynlink::Library<'static>,
}

/// The library named `name`, if the VM was given it.
pub fn open(name: &str) -> Option<Library> {
    let info = crate::env::boot_info();
    info.devices.iter().take(info.device_count as usize).find_map(|d| {
        if d.kind != DeviceKind::Library as u32 {
            return None;
        }
        let mut bytes = [0u8; 24];
        for (i, w) in d.params[..3].iter().enumerate() {
            bytes[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        let len = bytes.iter().position(|&b| b == 0).unwrap_or(24);
        if &bytes[..len] != name.as_bytes() {
            return None;
        }
        let (base, span) = (d.params[3], d.params[4]);
        // Only inside the window the monitor maps libraries in.
        if base < LIB_BASE || base.checked_add(span).is_none_or(|e| e > LIB_BASE + LIB_SIZE) {
            return None;
        }
        // SAFETY: the monitor mapped the library's segments there for the
        // VM's life (read-only pages where they are); `dynlink` reads it with
        // every access bounds-checked. Its gaps are not mapped: a library
        // whose tables point into them faults this VM, not another.
        let mem = unsafe { core::slice::from_raw_parts(base as *const u8, span as usize) };
        dynlink::Library::new(mem).map(|map| Library { base, map })
    })
}

impl Library {
    /// The address of its export `name` (function or variable).
    pub fn symbol(&self, name: &str) -> Option<usize> {
        self.map.lookup(name).map(|s| (self.base + s.value) as usize)
    }
}

/// Look up `symbol` in library `lib` (for [`crate::lib_fn!`]); a missing
/// library or symbol ends the program with a message saying which.
pub fn resolve(lib: &str, symbol: &str) -> usize {
    match open(lib).and_then(|l| l.symbol(symbol)) {
        Some(a) => a,
        None => {
            crate::eprintln!("{}: no {} in library {} (is the VM given it?)", crate::env::arg(0).unwrap_or("app"), symbol, lib);
            crate::process::exit(127)
        }
    }
}

/// A symbol's address as `lib_fn!` and `lib_var!` keep it: looked up on
/// first use, and again once a live update changed the generation.
pub struct Binding {
    at: AtomicUsize,
    generation: AtomicU32,
}

impl Binding {
    /// Not bound yet.
    pub const fn new() -> Binding {
        Binding { at: AtomicUsize::new(0), generation: AtomicU32::new(0) }
    }

    /// The address of `symbol` of library `lib` (see [`resolve`]).
    pub fn get(&self, lib: &str, symbol: &str) -> usize {
        let generation = generation();
        let mut at = self.at.load(Ordering::Relaxed);
        if at == 0 || self.generation.load(Ordering::Relaxed) != generation {
            at = resolve(lib, symbol);
            self.at.store(at, Ordering::Relaxed);
            self.generation.store(generation, Ordering::Relaxed);
        }
        at
    }
}

impl Default for Binding {
    fn default() -> Binding {
        Binding::new()
    }
}

/// Declare a function of a shared library, bound on its first call: the
/// address is looked up then (`wisp::lib::resolve`) and kept; later calls
/// go straight to it. The function is `unsafe` to call: the library's code
/// is not checked against the signature given.
#[macro_export]
macro_rules! lib_fn {
    ($lib:ident, fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?) => {
        #[allow(non_snake_case)]
        unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
            static BINDING: $crate::lib::Binding = $crate::lib::Binding::new();
            $crate::lib::enter();
            let at = BINDING.get(stringify!($lib), stringify!($name));
            // SAFETY: the caller's (see the macro's documentation).
            let f: extern "C" fn($($ty),*) $(-> $ret)? = unsafe { core::mem::transmute(at) };
            let r = f($($arg),*);
            $crate::lib::leave();
            r
        }
    };
}

/// Declare a variable of a shared library: `lib_var!(hello, hello_calls:
/// u64)` makes `fn hello_calls() -> *mut u64`, its address, looked up on
/// first use and again after a live update moved it. A pointer kept across
/// a scheduling point (an idle, a library call) may be stale: ask again.
#[macro_export]
macro_rules! lib_var {
    ($lib:ident, $name:ident: $ty:ty) => {
        #[allow(non_snake_case)]
        fn $name() -> *mut $ty {
            static BINDING: $crate::lib::Binding = $crate::lib::Binding::new();
            BINDING.get(stringify!($lib), stringify!($name)) as *mut $ty
        }
    };
}
