//! Shared libraries the monitor mapped for this VM (issue 17,
//! `docs/libraries.md`): found by name in the boot-info device table
//! (kind `Library`: its name, base and span), their symbols looked up
//! through their own hash tables (`dynlink`), and calls bound lazily:
//!
//! ```ignore
//! wisp::lib_fn!(hello, fn hello_version() -> u32);
//! let v = unsafe { hello_version() };   // looked up on the first call, then direct
//! ```

use wisp_abi::bootinfo::DeviceKind;
use wisp_abi::layout::{LIB_BASE, LIB_SIZE};

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

/// Declare a function of a shared library, bound on its first call: the
/// address is looked up then (`wisp::lib::resolve`) and kept; later calls
/// go straight to it. The function is `unsafe` to call: the library's code
/// is not checked against the signature given.
#[macro_export]
macro_rules! lib_fn {
    ($lib:ident, fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?) => {
        #[allow(non_snake_case)]
        unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
            static SLOT: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);
            let mut at = SLOT.load(core::sync::atomic::Ordering::Relaxed);
            if at == 0 {
                at = $crate::lib::resolve(stringify!($lib), stringify!($name));
                SLOT.store(at, core::sync::atomic::Ordering::Relaxed);
            }
            // SAFETY: the caller's (see the macro's documentation).
            let f: extern "C" fn($($ty),*) $(-> $ret)? = unsafe { core::mem::transmute(at) };
            f($($arg),*)
        }
    };
}
