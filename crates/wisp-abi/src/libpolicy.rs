//! An image's policy for the shared libraries it may be given (issue 17,
//! KylinX §3.3.4; `docs/libraries.md` "Restrictions"): which signers it
//! trusts, the lowest version it takes, and who may supply a library. A
//! second ELF note beside the ABI note (name [`crate::NOTE_NAME`], type
//! [`crate::NOTE_TYPE_LIBS`], descriptor a [`LibPolicy`]: little-endian,
//! 4-byte aligned). An addition, not a bump: an image without it takes
//! any library from anyone (as before), and an older monitor ignores it.
//! The library OS emits it from `wisp::lib_policy!`; the monitor checks
//! every library against it before it maps one.

/// Most signing keys a policy names.
pub const MAX_KEYS: usize = 4;

/// Who may supply a library ([`LibPolicy::loaders`]).
pub mod loader {
    /// A library the image names in its manifest (a `Library` device of
    /// its ABI note), given when the VM is created.
    pub const NAMED: u32 = 1 << 0;
    /// Any library the VM's creator gives it (`--lib`), named or not.
    pub const CREATOR: u32 = 1 << 1;
    /// A live update replacing one of its libraries while it runs.
    pub const UPDATE: u32 = 1 << 2;
    /// Every loader this ABI defines.
    pub const ALL: u32 = NAMED | CREATOR | UPDATE;
}

/// The policy's descriptor.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LibPolicy {
    /// Used entries of `keys` (0: unsigned libraries are taken too).
    pub key_count: u32,
    /// [`loader`] bits: who may supply a library.
    pub loaders: u32,
    /// Lowest version taken: major, minor, patch, and 0 (all 0: any,
    /// unsigned too; else only a signed library of at least this version).
    pub min_version: [u16; 4],
    /// Ed25519 public keys of the signers trusted.
    pub keys: [[u8; 32]; MAX_KEYS],
}

/// Size in bytes of a [`LibPolicy`] descriptor.
pub const LIB_POLICY_SIZE: usize = 16 + MAX_KEYS * 32;

const _: () = assert!(core::mem::size_of::<LibPolicy>() == LIB_POLICY_SIZE);
const _: () = assert!(core::mem::align_of::<LibPolicy>() == 4);

impl LibPolicy {
    /// Any library from any loader (what an image without the note gets).
    pub const fn new() -> LibPolicy {
        LibPolicy { key_count: 0, loaders: loader::ALL, min_version: [0; 4], keys: [[0; 32]; MAX_KEYS] }
    }

    /// Also trust signer `key` (an Ed25519 public key, 64 hex digits as
    /// `wisp lib keygen` prints it). Panics at compile time (meant for
    /// `const` policies) on a bad key or a full table.
    pub const fn key(mut self, hex: &str) -> LibPolicy {
        let h = hex.as_bytes();
        assert!(h.len() == 64, "a key is 64 hex digits");
        assert!((self.key_count as usize) < MAX_KEYS, "too many keys");
        let mut i = 0;
        while i < 32 {
            self.keys[self.key_count as usize][i] = nibble(h[2 * i]) << 4 | nibble(h[2 * i + 1]);
            i += 1;
        }
        self.key_count += 1;
        self
    }

    /// Take only libraries of at least this version.
    pub const fn min_version(mut self, major: u16, minor: u16, patch: u16) -> LibPolicy {
        self.min_version = [major, minor, patch, 0];
        self
    }

    /// Only these [`loader`]s may supply a library.
    pub const fn loaders(mut self, bits: u32) -> LibPolicy {
        self.loaders = bits;
        self
    }

    /// The keys named.
    pub fn keys(&self) -> &[[u8; 32]] {
        &self.keys[..(self.key_count as usize).min(MAX_KEYS)]
    }

    /// Parse a note descriptor (little endian). `None` if it is too short,
    /// names more keys than fit, or a loader this ABI does not define.
    pub fn parse(desc: &[u8]) -> Option<LibPolicy> {
        if desc.len() < LIB_POLICY_SIZE {
            return None;
        }
        let word = |off: usize| u32::from_le_bytes([desc[off], desc[off + 1], desc[off + 2], desc[off + 3]]);
        let half = |off: usize| u16::from_le_bytes([desc[off], desc[off + 1]]);
        let (key_count, loaders) = (word(0), word(4));
        if key_count as usize > MAX_KEYS || loaders & !loader::ALL != 0 {
            return None;
        }
        let mut p = LibPolicy { key_count, loaders, min_version: [half(8), half(10), half(12), half(14)], ..LibPolicy::new() };
        for (i, k) in p.keys.iter_mut().enumerate() {
            k.copy_from_slice(&desc[16 + i * 32..16 + (i + 1) * 32]);
        }
        Some(p)
    }
}

impl Default for LibPolicy {
    fn default() -> Self {
        LibPolicy::new()
    }
}

const fn nibble(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => panic!("not a hex digit"),
    }
}

/// The whole ELF note as the library OS places it in `.note.wisp`.
#[repr(C)]
pub struct PolicyNote {
    namesz: u32,
    descsz: u32,
    ntype: u32,
    name: [u8; 8],
    desc: LibPolicy,
}

impl PolicyNote {
    /// The note carrying `desc`.
    pub const fn new(desc: LibPolicy) -> PolicyNote {
        PolicyNote { namesz: crate::NOTE_NAME.len() as u32, descsz: LIB_POLICY_SIZE as u32, ntype: crate::NOTE_TYPE_LIBS, name: *b"wisp\0\0\0\0", desc }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The descriptor's bytes, as the note holds them.
    fn bytes(p: &LibPolicy) -> [u8; LIB_POLICY_SIZE] {
        let mut b = [0u8; LIB_POLICY_SIZE];
        b[0..4].copy_from_slice(&p.key_count.to_le_bytes());
        b[4..8].copy_from_slice(&p.loaders.to_le_bytes());
        for (i, v) in p.min_version.iter().enumerate() {
            b[8 + 2 * i..10 + 2 * i].copy_from_slice(&v.to_le_bytes());
        }
        for (i, k) in p.keys.iter().enumerate() {
            b[16 + 32 * i..16 + 32 * (i + 1)].copy_from_slice(k);
        }
        b
    }

    #[test]
    fn a_policy_is_read_back_as_written() {
        const P: LibPolicy = LibPolicy::new()
            .key("ea4a6c63e29c520abef5507b132ec5f9954776aebebe7b92421eea691446d22c")
            .min_version(1, 2, 3)
            .loaders(loader::NAMED | loader::UPDATE);
        let back = LibPolicy::parse(&bytes(&P)).unwrap();
        assert_eq!(back, P);
        assert_eq!(back.keys(), &[P.keys[0]]);
        assert_eq!(P.keys[0][..2], [0xea, 0x4a]);
        assert_eq!(LibPolicy::parse(&bytes(&LibPolicy::new())).unwrap().loaders, loader::ALL);
    }

    #[test]
    fn a_malformed_policy_is_refused() {
        let good = bytes(&LibPolicy::new());
        assert_eq!(LibPolicy::parse(&good[..LIB_POLICY_SIZE - 1]), None);
        let mut b = good;
        b[0] = 5;
        assert_eq!(LibPolicy::parse(&b), None, "more keys than fit");
        let mut b = good;
        b[4] = 0x80;
        assert_eq!(LibPolicy::parse(&b), None, "an unknown loader");
    }
}
