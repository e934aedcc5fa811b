//! Applications built as shared libraries (issue 17, recycling; KylinX
//! §3.3.3): what a guest that loads one (the `recycler` image) hands its
//! entry, [`APP_ENTRY`]: `extern "C" fn(&AppSys) -> i32`, the app's exit
//! status. A library links against nothing, so the services it may use
//! come as function pointers here; `guest/lib/wisp-app` wraps them for
//! apps written in Rust. A guest-side contract (the monitor does not read
//! it): versioned by [`APP_ABI`].

/// The version of [`AppSys`] a loader hands.
pub const APP_ABI: u32 = 1;

/// The symbol an application library exports as its entry.
pub const APP_ENTRY: &str = "wisp_app_main";

/// What a loader hands an application's entry.
#[repr(C)]
pub struct AppSys {
    /// [`APP_ABI`].
    pub version: u32,
    /// Number of arguments at `args`.
    pub argc: u32,
    /// The arguments, each NUL-terminated, `args_len` bytes in all;
    /// argument 0 is the app's name.
    pub args: *const u8,
    pub args_len: usize,
    /// Bytes of the VM's RAM.
    pub mem_size: u64,
    /// Write `len` bytes at `data` to standard output (`fd` 1) or standard
    /// error (2): the bytes written, or a negative errno.
    pub write: extern "C" fn(fd: u32, data: *const u8, len: usize) -> isize,
    /// Nanoseconds since the app was started (monotonic).
    pub uptime_ns: extern "C" fn() -> u64,
    /// Nanoseconds since the Unix epoch (wall clock).
    pub wall_ns: extern "C" fn() -> u64,
}
