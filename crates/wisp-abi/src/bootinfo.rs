//! The boot-info page: everything the guest knows about its machine, written
//! by the monitor at [`crate::layout::BOOT_INFO`] before the first instruction
//! runs. The guest reads it instead of probing hardware, and it is also the
//! per-VM "device page" that replaces any central registry: later devices
//! (NICs, block rings) are described in [`BootInfo::devices`].

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// `BootInfo::magic`: "WISPBOOT" in little endian.
pub const BOOT_MAGIC: u64 = u64::from_le_bytes(*b"WISPBOOT");
/// Capacity of the argument area in bytes.
pub const ARGS_MAX: usize = 2048;
/// Capacity of the device table.
pub const MAX_DEVICES: usize = 8;

/// Kinds of device in the device table.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// Empty slot.
    None = 0,
    /// A virtual NIC (see [`crate::net`]).
    Net = 1,
    /// The environment and read-only files given at start (see
    /// [`crate::data`]): a region the monitor fills before the first
    /// instruction; no kicks.
    Data = 2,
    /// A virtual disk (see [`crate::blk`]).
    Block = 3,
    /// A shared library the monitor mapped in the library window
    /// ([`crate::layout::LIB_BASE`]): no region in RAM; `params[0..3]` its
    /// name (NUL-padded UTF-8), `params[3]` the guest address of its base,
    /// `params[4]` the bytes from there to its last segment's end. Its
    /// segments are where its program headers put them from that base.
    Library = 4,
}

impl DeviceKind {
    /// The kind a table or manifest entry names, if this ABI defines it.
    pub const fn from_u32(v: u32) -> Option<DeviceKind> {
        match v {
            0 => Some(DeviceKind::None),
            1 => Some(DeviceKind::Net),
            2 => Some(DeviceKind::Data),
            3 => Some(DeviceKind::Block),
            4 => Some(DeviceKind::Library),
            _ => None,
        }
    }

    /// A short name for people ("net").
    pub const fn name(self) -> &'static str {
        match self {
            DeviceKind::None => "none",
            DeviceKind::Net => "net",
            DeviceKind::Data => "data",
            DeviceKind::Block => "block",
            DeviceKind::Library => "library",
        }
    }
}

/// Flags of a device-table entry that mean the same for every kind (the
/// high 16 bits of [`DeviceDesc::flags`]; the low 16 are the kind's own).
pub mod device_flags {
    /// The device has a doorbell port, `crate::DOORBELL_PORT_BASE` + its
    /// index: an `out` of any byte there kicks it. Set by monitors that
    /// serve doorbells (older guests ignore it and use the notify
    /// hypercall, which stays).
    pub const DOORBELL: u32 = 1 << 16;
    /// A NIC whose queued TX frames the monitor sends when the vCPU parks
    /// (the idle hypercall), before it sleeps: a guest about to park may
    /// leave a kick by exit (`wisp_abi::net::hdr::KICK_EXIT`) to the park
    /// instead of paying two exits. Older guests ignore it.
    pub const PARK_SENDS: u32 = 1 << 17;
}

/// One entry of the device table. The meaning of `base`, `size` and `params`
/// depends on `kind`; an entry with `kind == 0` is unused.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct DeviceDesc {
    /// A [`DeviceKind`] value.
    pub kind: u32,
    /// Kind-specific flags.
    pub flags: u32,
    /// Guest-physical base of the device's shared memory (rings).
    pub base: u64,
    /// Size of that shared memory in bytes.
    pub size: u64,
    /// Kind-specific parameters (addresses, MAC, ring sizes...).
    pub params: [u64; 5],
}

/// The boot-info page. All integers little endian; the layout is `repr(C)`
/// with no padding so monitor and guest see the same bytes.
#[repr(C)]
#[derive(Clone, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BootInfo {
    /// [`BOOT_MAGIC`].
    pub magic: u64,
    /// [`crate::ABI_VERSION`] of the monitor that booted this VM.
    pub abi_version: u32,
    /// Number of vCPUs (1).
    pub cpu_count: u32,
    /// Bytes of guest RAM, starting at guest-physical 0.
    pub mem_size: u64,
    /// First byte of the loaded image.
    pub image_start: u64,
    /// One past the last byte of the loaded image (page aligned).
    pub image_end: u64,
    /// First byte the guest may use as heap.
    pub heap_start: u64,
    /// One past the last byte of heap (end of RAM).
    pub heap_end: u64,
    /// Lowest address of the stack.
    pub stack_bottom: u64,
    /// Initial stack pointer.
    pub stack_top: u64,
    /// Frequency of the time-stamp counter the guest reads with `rdtsc`.
    pub tsc_hz: u64,
    /// Guest TSC value at the moment `wall_clock_ns` was sampled; the
    /// guest's monotonic clock counts from here ("boot").
    pub boot_tsc: u64,
    /// Host `CLOCK_REALTIME` in ns since the Unix epoch at `boot_tsc`.
    pub wall_clock_ns: u64,
    /// Number of arguments in `args`.
    pub argc: u32,
    /// Bytes used in `args`.
    pub args_len: u32,
    /// Arguments, each terminated by a NUL byte; argument 0 is the image name.
    pub args: [u8; ARGS_MAX],
    /// Number of used entries in `devices`.
    pub device_count: u32,
    /// Shared libraries' state, written by the monitor: bit 0 set while an
    /// update waits for the guest to call [`crate::Hypercall::Library`]
    /// where it runs no library code; bits 1.. a generation, bumped (by 2)
    /// each time a library's entry changed — addresses looked up in an
    /// older generation are stale. Zero at boot.
    pub lib_state: u32,
    /// The device table.
    pub devices: [DeviceDesc; MAX_DEVICES],
}

impl BootInfo {
    /// An empty boot-info page with the magic and ABI version set.
    pub fn new() -> BootInfo {
        let mut b = BootInfo::new_zeroed();
        b.magic = BOOT_MAGIC;
        b.abi_version = crate::ABI_VERSION;
        b.cpu_count = 1;
        b
    }

    /// Store the arguments. Fails (returning the bytes needed) if they do not
    /// fit in [`ARGS_MAX`] bytes or one contains a NUL byte (`usize::MAX`);
    /// a failed call leaves the page as it was.
    pub fn set_args<'a, I: IntoIterator<Item = &'a str> + Clone>(&mut self, args: I) -> Result<(), usize> {
        let mut len = 0usize;
        for a in args.clone() {
            if a.as_bytes().contains(&0) {
                return Err(usize::MAX);
            }
            len += a.len() + 1;
        }
        if len > ARGS_MAX {
            return Err(len);
        }
        let mut at = 0;
        let mut argc = 0u32;
        for a in args {
            let b = a.as_bytes();
            self.args[at..at + b.len()].copy_from_slice(b);
            self.args[at + b.len()] = 0;
            at += b.len() + 1;
            argc += 1;
        }
        self.argc = argc;
        self.args_len = len as u32;
        Ok(())
    }

    /// Iterate over the arguments (as bytes, without the NULs).
    pub fn args(&self) -> impl Iterator<Item = &[u8]> {
        let len = (self.args_len as usize).min(ARGS_MAX);
        self.args[..len].split(|&c| c == 0).take(self.argc as usize)
    }
}

impl Default for BootInfo {
    fn default() -> Self {
        BootInfo::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_in_a_page() {
        assert!(core::mem::size_of::<BootInfo>() <= 4096);
        assert_eq!(core::mem::size_of::<DeviceDesc>(), 64);
    }

    #[test]
    fn args_round_trip() {
        let mut b = BootInfo::new();
        b.set_args(["hello", "a b", ""]).unwrap();
        let got: [&[u8]; 3] = {
            let mut it = b.args();
            [it.next().unwrap(), it.next().unwrap(), it.next().unwrap()]
        };
        assert_eq!(got, [&b"hello"[..], b"a b", b""]);
        assert_eq!(b.args().count(), 3);
        assert_eq!(b.argc, 3);
    }

    #[test]
    fn args_too_long_or_with_nul() {
        let mut b = BootInfo::new();
        let big = "x".repeat(ARGS_MAX);
        assert_eq!(b.set_args([big.as_str()]), Err(ARGS_MAX + 1));
        assert_eq!(b.set_args(["a\0b"]), Err(usize::MAX));
    }

    #[test]
    fn a_refused_set_args_leaves_the_page_as_it_was() {
        // Found by fuzz/fuzz_targets/boot_args.rs: earlier arguments used to
        // be copied over the old ones before a later one was refused.
        let mut b = BootInfo::new();
        b.set_args(["old", "args"]).unwrap();
        let big = "y".repeat(ARGS_MAX);
        assert_eq!(b.set_args(["new", "a\0b"]), Err(usize::MAX));
        assert_eq!(b.set_args(["new", big.as_str()]), Err(4 + ARGS_MAX + 1));
        let got: alloc_free::Args = b.args().collect();
        assert_eq!(got.as_slice(), [&b"old"[..], b"args"]);
    }

    /// Two arguments without an allocator.
    mod alloc_free {
        #[derive(Default)]
        pub struct Args<'a>([&'a [u8]; 2], usize);
        impl<'a> FromIterator<&'a [u8]> for Args<'a> {
            fn from_iter<I: IntoIterator<Item = &'a [u8]>>(it: I) -> Self {
                let mut a = Args::default();
                for x in it {
                    a.0[a.1.min(1)] = x;
                    a.1 += 1;
                }
                a
            }
        }
        impl<'a> Args<'a> {
            pub fn as_slice(&self) -> &[&'a [u8]] {
                &self.0[..self.1.min(2)]
            }
        }
    }
}
