//! The image manifest: what an image needs from its monitor, declared in the
//! image's ELF note and checked when the image is loaded (after Solo5's
//! `mft_abi.h`), so an image is refused with one clear line instead of
//! failing mid-run.
//!
//! # Versions and features
//!
//! - [`crate::ABI_VERSION`] is bumped when an existing contract changes
//!   incompatibly: the layout of the boot-info page, of an argument block or
//!   of this note, or the meaning of a hypercall. Image and monitor must
//!   speak the same version; the monitor refuses any other.
//! - Everything *added* (a hypercall, a family operation, a device kind) is
//!   a new [`features`] bit or [`DeviceKind`], not a bump. An image declares
//!   the features it uses; a monitor refuses at load an image that needs a
//!   feature it does not have, and answers a hypercall of a feature the
//!   image did not declare with `ENOSYS`.
//! - Devices: an image lists the devices it uses, each required or
//!   optional. The monitor refuses at load an image that requires a device
//!   the run does not attach, or a device kind it does not know.
//!
//! # The note
//!
//! Name [`crate::NOTE_NAME`], type [`crate::NOTE_TYPE_ABI`], descriptor an
//! [`ImageNote`] (all fields little-endian `u32`s, so the descriptor needs
//! only 4-byte alignment, as ELF notes have). The library OS emits it from
//! `wisp::main!`.

use crate::bootinfo::{DeviceKind, MAX_DEVICES};

/// Feature bits (word 0 of [`ImageNote::features`]).
pub mod features {
    /// The fork hypercall ([`crate::Hypercall::Fork`]).
    pub const FORK: u64 = 1 << 0;
    /// Family IPC ([`crate::Hypercall::Family`]): pipes, signals, wait,
    /// message queues, shared memory.
    pub const FAMILY: u64 = 1 << 1;
    /// Standard error and standard input ([`crate::Hypercall::Stdio`]).
    /// Declared by every image of the library OS (`wisp::main!`).
    pub const STDIO: u64 = 1 << 2;
    /// The ready call ([`crate::Hypercall::Ready`]): where a template is
    /// saved.
    pub const READY: u64 = 1 << 3;
    /// Every feature this version of the ABI defines.
    pub const ALL: u64 = FORK | FAMILY | STDIO | READY;

    /// The name of feature bit `bit` (0..64), or `None` if this ABI does
    /// not define it.
    pub const fn name(bit: u32) -> Option<&'static str> {
        match bit {
            0 => Some("fork"),
            1 => Some("family"),
            2 => Some("stdio"),
            3 => Some("ready"),
            _ => None,
        }
    }

    /// Feature bits for people: `fork, family`, `bit 37` for a bit this
    /// ABI does not define, `none` for no bit.
    pub struct Names(pub u64);

    impl core::fmt::Display for Names {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            if self.0 == 0 {
                return f.write_str("none");
            }
            let mut sep = "";
            for bit in (0..64).filter(|b| self.0 & (1 << b) != 0) {
                match name(bit) {
                    Some(n) => write!(f, "{sep}{n}")?,
                    None => write!(f, "{sep}bit {bit}")?,
                }
                sep = ", ";
            }
            Ok(())
        }
    }
}

/// Bytes of a device name in the manifest (NUL-padded).
pub const DEVICE_NAME_SIZE: usize = 16;

/// Flag of a [`ManifestDevice`]: the image cannot run without it.
pub const DEVICE_REQUIRED: u32 = 1 << 0;

/// One device an image uses.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestDevice {
    /// A [`DeviceKind`] value.
    pub kind: u32,
    /// [`DEVICE_REQUIRED`] or 0 (optional).
    pub flags: u32,
    /// The device's name (`net0`), NUL-padded.
    pub name: [u8; DEVICE_NAME_SIZE],
}

impl ManifestDevice {
    /// An empty entry.
    pub const EMPTY: ManifestDevice = ManifestDevice { kind: 0, flags: 0, name: [0; DEVICE_NAME_SIZE] };

    /// The name as a string (up to its first NUL; `?` if not UTF-8).
    pub fn name(&self) -> &str {
        let len = self.name.iter().position(|&b| b == 0).unwrap_or(DEVICE_NAME_SIZE);
        core::str::from_utf8(&self.name[..len]).unwrap_or("?")
    }

    /// Whether the image needs it.
    pub fn required(&self) -> bool {
        self.flags & DEVICE_REQUIRED != 0
    }
}

/// The note's descriptor: ABI version, features, devices.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageNote {
    /// [`crate::ABI_VERSION`] the image was built against.
    pub abi_version: u32,
    /// Number of used entries in `devices`.
    pub device_count: u32,
    /// Required feature bits as two little-endian words (low, high).
    pub features: [u32; 2],
    /// The devices the image uses.
    pub devices: [ManifestDevice; MAX_DEVICES],
}

/// Size in bytes of an [`ImageNote`] descriptor.
pub const IMAGE_NOTE_SIZE: usize = 16 + MAX_DEVICES * (8 + DEVICE_NAME_SIZE);

const _: () = assert!(core::mem::size_of::<ImageNote>() == IMAGE_NOTE_SIZE);
const _: () = assert!(core::mem::align_of::<ImageNote>() == 4);

impl ImageNote {
    /// A manifest of this ABI version that needs nothing.
    pub const fn new() -> ImageNote {
        ImageNote { abi_version: crate::ABI_VERSION, device_count: 0, features: [0, 0], devices: [ManifestDevice::EMPTY; MAX_DEVICES] }
    }

    /// Also needs `bits` (see [`features`]).
    pub const fn features(mut self, bits: u64) -> ImageNote {
        let all = self.feature_bits() | bits;
        self.features = [all as u32, (all >> 32) as u32];
        self
    }

    /// Also uses device `name` of `kind`; `required`: it cannot run without.
    /// Panics at compile time (this is meant for `const` manifests) if the
    /// table is full or the name too long.
    pub const fn device(mut self, kind: DeviceKind, name: &str, required: bool) -> ImageNote {
        let n = name.as_bytes();
        assert!(n.len() < DEVICE_NAME_SIZE, "device name too long");
        assert!((self.device_count as usize) < MAX_DEVICES, "too many devices");
        let mut d = ManifestDevice { kind: kind as u32, flags: if required { DEVICE_REQUIRED } else { 0 }, name: [0; DEVICE_NAME_SIZE] };
        let mut i = 0;
        while i < n.len() {
            d.name[i] = n[i];
            i += 1;
        }
        self.devices[self.device_count as usize] = d;
        self.device_count += 1;
        self
    }

    /// Needs shared library `name` (a library given under that name: its
    /// file's stem; `docs/libraries.md`).
    pub const fn library(self, name: &str) -> ImageNote {
        self.device(DeviceKind::Library, name, true)
    }

    /// Also uses a NIC named `net0` (the first in the boot-info table).
    pub const fn nic(self, required: bool) -> ImageNote {
        self.device(DeviceKind::Net, "net0", required)
    }

    /// The required feature bits.
    pub const fn feature_bits(&self) -> u64 {
        self.features[0] as u64 | (self.features[1] as u64) << 32
    }

    /// The used entries of the device table.
    pub fn devices(&self) -> &[ManifestDevice] {
        &self.devices[..(self.device_count as usize).min(MAX_DEVICES)]
    }

    /// Parse a note descriptor (little endian). `None` if it is too short
    /// for this ABI's layout or its device count is out of range.
    pub fn parse(desc: &[u8]) -> Option<ImageNote> {
        let word = |off: usize| -> Option<u32> {
            let b = desc.get(off..off + 4)?;
            Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let abi_version = word(0)?;
        if abi_version != crate::ABI_VERSION {
            // Another version's layout: only the version is meaningful.
            return Some(ImageNote { abi_version, ..ImageNote::new() });
        }
        if desc.len() < IMAGE_NOTE_SIZE {
            return None;
        }
        let device_count = word(4)?;
        if device_count as usize > MAX_DEVICES {
            return None;
        }
        let mut note = ImageNote { abi_version, device_count, features: [word(8)?, word(12)?], ..ImageNote::new() };
        for (i, d) in note.devices.iter_mut().enumerate() {
            let at = 16 + i * (8 + DEVICE_NAME_SIZE);
            d.kind = word(at)?;
            d.flags = word(at + 4)?;
            d.name.copy_from_slice(desc.get(at + 8..at + 8 + DEVICE_NAME_SIZE)?);
        }
        Some(note)
    }
}

impl Default for ImageNote {
    fn default() -> Self {
        ImageNote::new()
    }
}

/// The whole ELF note (header, name, descriptor) as the library OS places
/// it in its `.note.wisp` section.
#[repr(C)]
pub struct Note {
    namesz: u32,
    descsz: u32,
    ntype: u32,
    name: [u8; 8],
    desc: ImageNote,
}

impl Note {
    /// The note carrying `desc`.
    pub const fn new(desc: ImageNote) -> Note {
        Note {
            namesz: crate::NOTE_NAME.len() as u32,
            descsz: IMAGE_NOTE_SIZE as u32,
            ntype: crate::NOTE_TYPE_ABI,
            name: *b"wisp\0\0\0\0",
            desc,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: &ImageNote) -> [u8; IMAGE_NOTE_SIZE] {
        let mut b = [0u8; IMAGE_NOTE_SIZE];
        let mut put = |at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        put(0, n.abi_version);
        put(4, n.device_count);
        put(8, n.features[0]);
        put(12, n.features[1]);
        for (i, d) in n.devices.iter().enumerate() {
            let at = 16 + i * 24;
            put(at, d.kind);
            put(at + 4, d.flags);
        }
        for (i, d) in n.devices.iter().enumerate() {
            let at = 16 + i * 24 + 8;
            b[at..at + DEVICE_NAME_SIZE].copy_from_slice(&d.name);
        }
        b
    }

    #[test]
    fn manifest_round_trips() {
        const M: ImageNote = ImageNote::new().features(features::FORK | features::FAMILY).device(DeviceKind::Net, "net0", true);
        let n = ImageNote::parse(&bytes(&M)).unwrap();
        assert_eq!(n, M);
        assert_eq!(n.feature_bits(), features::FORK | features::FAMILY);
        assert_eq!(n.devices().len(), 1);
        assert_eq!(n.devices()[0].name(), "net0");
        assert!(n.devices()[0].required());
        assert_eq!(core::mem::size_of::<Note>(), 20 + IMAGE_NOTE_SIZE);
    }

    #[test]
    fn bad_descriptors_are_refused() {
        let good = bytes(&ImageNote::new());
        assert!(ImageNote::parse(&good[..IMAGE_NOTE_SIZE - 1]).is_none());
        assert!(ImageNote::parse(&good[..3]).is_none());
        let mut many = good;
        many[4] = MAX_DEVICES as u8 + 1;
        assert!(ImageNote::parse(&many).is_none());
        // Another version: only the version is read (the monitor refuses it).
        let n = ImageNote::parse(&[1, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(n.abi_version, 1);
        assert_eq!(n.feature_bits(), 0);
    }

    #[test]
    fn feature_names() {
        use core::fmt::Write;
        assert_eq!(features::name(0), Some("fork"));
        assert_eq!(features::name(1), Some("family"));
        assert_eq!(features::name(2), Some("stdio"));
        assert_eq!(features::name(3), Some("ready"));
        assert_eq!(features::name(40), None);
        assert_eq!(features::ALL.count_ones(), 4);
        let mut s = Buf::default();
        write!(s, "{}|{}", features::Names(features::ALL | 1 << 40), features::Names(0)).unwrap();
        assert_eq!(s.as_str(), "fork, family, stdio, ready, bit 40|none");
    }

    /// A fixed buffer to format into (no alloc here).
    struct Buf {
        b: [u8; 64],
        n: usize,
    }

    impl Default for Buf {
        fn default() -> Self {
            Buf { b: [0; 64], n: 0 }
        }
    }

    impl Buf {
        fn as_str(&self) -> &str {
            core::str::from_utf8(&self.b[..self.n]).unwrap()
        }
    }

    impl core::fmt::Write for Buf {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            let end = self.n + s.len();
            self.b.get_mut(self.n..end).ok_or(core::fmt::Error)?.copy_from_slice(s.as_bytes());
            self.n = end;
            Ok(())
        }
    }
}
