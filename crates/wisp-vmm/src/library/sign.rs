//! A library's signature and version (issue 17, item 4): a trailer after
//! the ELF bytes, which ELF readers ignore.
//!
//! ```text
//! [ELF file][WISPLIB1 | major minor patch (u16 each) | 0 (u16) |
//!            Ed25519 public key (32) | signature (64) | ELF length (u64)]
//! ```
//!
//! The signature (`ed25519-dalek`) is over SHA-256 of the ELF bytes
//! followed by the version's 8 bytes: neither can change without it
//! failing. A trailer is checked before anything else of the file is
//! used; a file without one is unsigned (a policy may refuse it).

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::error::LibraryError as Refused;

const MAGIC: &[u8; 8] = b"WISPLIB1";
/// Bytes of the trailer.
pub const TRAILER: usize = 8 + 8 + 32 + 64 + 8;

/// A library's version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u16,
    pub minor: u16,
    pub patch: u16,
}

impl std::str::FromStr for Version {
    type Err = String;

    fn from_str(s: &str) -> Result<Version, String> {
        let parts: Vec<u16> = s.split('.').map(|p| p.parse::<u16>()).collect::<Result<_, _>>().map_err(|_| format!("version {s:?}: expected MAJOR.MINOR.PATCH"))?;
        match parts[..] {
            [major, minor, patch] => Ok(Version { major, minor, patch }),
            _ => Err(format!("version {s:?}: expected MAJOR.MINOR.PATCH")),
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl Version {
    fn bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0..2].copy_from_slice(&self.major.to_le_bytes());
        b[2..4].copy_from_slice(&self.minor.to_le_bytes());
        b[4..6].copy_from_slice(&self.patch.to_le_bytes());
        b
    }
}

/// Who signed a library, and its version (the signature verified).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signed {
    pub version: Version,
    /// The signer's Ed25519 public key.
    pub key: [u8; 32],
}

fn digest(elf: &[u8], v: &Version) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(elf);
    h.update(v.bytes());
    h.finalize().into()
}

/// `elf` (a library without a trailer) signed with `key` as `version`.
pub fn sign(elf: &[u8], version: Version, key: &SigningKey) -> Result<Vec<u8>, Refused> {
    if split(elf)?.1.is_some() {
        return Err(Refused::Format("it is signed already".into()));
    }
    let sig = key.sign(&digest(elf, &version));
    let mut out = Vec::with_capacity(elf.len() + TRAILER);
    out.extend_from_slice(elf);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&version.bytes());
    out.extend_from_slice(key.verifying_key().as_bytes());
    out.extend_from_slice(&sig.to_bytes());
    out.extend_from_slice(&(elf.len() as u64).to_le_bytes());
    Ok(out)
}

/// The ELF bytes of `file`, and who signed them (checked), if it is signed.
pub fn split(file: &[u8]) -> Result<(&[u8], Option<Signed>), Refused> {
    let Some(at) = file.len().checked_sub(TRAILER) else { return Ok((file, None)) };
    let t = &file[at..];
    if &t[..8] != MAGIC {
        return Ok((file, None));
    }
    let (elf, Some(signed)) = split_unverified(file) else {
        return Err(Refused::Signature("the trailer does not fit the file (cut or extended)".into()));
    };
    let sig = Signature::from_bytes(&t[48..112].try_into().expect("64 bytes"));
    let vk = VerifyingKey::from_bytes(&signed.key).map_err(|_| Refused::Signature("its key is not an Ed25519 public key".into()))?;
    vk.verify_strict(&digest(elf, &signed.version), &sig).map_err(|_| Refused::Signature("it does not verify: the library or its version was changed after signing".into()))?;
    Ok((elf, Some(signed)))
}

/// The ELF bytes of `file` and what its trailer says (signer, version),
/// the signature *not* verified: for a copy whose signature its sender
/// verified (the daemon's sealed memfd: what the VMM process maps is still
/// the ELF it parses itself, and the image's policy is checked against the
/// signer and version the daemon verified).
pub fn split_unverified(file: &[u8]) -> (&[u8], Option<Signed>) {
    let Some(at) = file.len().checked_sub(TRAILER) else { return (file, None) };
    let t = &file[at..];
    if &t[..8] != MAGIC || u64::from_le_bytes(t[112..120].try_into().expect("8 bytes")) != at as u64 {
        return (file, None);
    }
    let u16_at = |i: usize| u16::from_le_bytes(t[i..i + 2].try_into().expect("2 bytes"));
    let version = Version { major: u16_at(8), minor: u16_at(10), patch: u16_at(12) };
    (&file[..at], Some(Signed { version, key: t[16..48].try_into().expect("32 bytes") }))
}

/// What an image accepts of its libraries (`wisp_abi::manifest`): keys
/// (none: unsigned libraries too) and the lowest version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    pub keys: Vec<[u8; 32]>,
    pub min_version: Option<Version>,
}

impl Policy {
    /// Whether a library signed as `signed` (or not at all) may be used.
    pub fn check(&self, signed: Option<&Signed>) -> Result<(), Refused> {
        let hex = |k: &[u8; 32]| k.iter().take(8).map(|b| format!("{b:02x}")).collect::<String>();
        match (signed, self.keys.is_empty()) {
            (None, false) => return Err(Refused::Policy("it is not signed, and the image takes signed libraries only".into())),
            (Some(s), false) if !self.keys.contains(&s.key) => {
                return Err(Refused::Policy(format!("it is signed with key {}…, which the image does not trust", hex(&s.key))))
            }
            _ => {}
        }
        if let Some(min) = self.min_version {
            // A version is only the signer's word: with no signer trusted,
            // anyone may state any version.
            if self.keys.is_empty() {
                return Err(Refused::Policy(format!("a lowest version ({min}) means nothing without trusted keys")));
            }
            match signed {
                Some(s) if s.version >= min => {}
                Some(s) => return Err(Refused::Policy(format!("version {} is older than the {min} the image takes", s.version))),
                None => return Err(Refused::Policy(format!("it states no version, and the image takes {min} or newer"))),
            }
        }
        Ok(())
    }
}

/// A signing key from its 32-byte secret seed.
pub fn key_from_seed(seed: &[u8; 32]) -> SigningKey {
    SigningKey::from_bytes(seed)
}
