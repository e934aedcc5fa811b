//! An image's restrictions on the libraries it is given (issue 17,
//! KylinX §3.3.4; `docs/libraries.md` "Restrictions"), checked before a
//! library is mapped: its signer and version (`sign::Policy`), and who
//! supplies it — KylinX's *loader* — from the image's policy note
//! (`wisp_abi::libpolicy`).

use wisp_abi::libpolicy::{loader, LibPolicy};
use wisp_abi::{DeviceKind, ImageNote};

use super::sign::{Policy, Signed, Version};
use crate::error::LibraryError;

/// How a library comes to a VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loader {
    /// Given when the VM is created (`--lib`).
    Create,
    /// A live update replacing one the VM maps.
    Update,
}

/// Whether library `name`, signed as `signed`, may come to a VM of an
/// image with manifest `manifest` and library policy `policy` (none: any
/// library from any loader) by `how`.
pub fn allowed(manifest: &ImageNote, policy: Option<&LibPolicy>, name: &str, signed: Option<&Signed>, how: Loader) -> Result<(), LibraryError> {
    let Some(p) = policy else { return Ok(()) };
    let refuse = |m: String| Err(LibraryError::Policy(m));
    let named = manifest.devices().iter().any(|d| d.kind == DeviceKind::Library as u32 && d.name() == name);
    match how {
        Loader::Update if p.loaders & loader::UPDATE == 0 => return refuse("the image does not let its libraries be replaced while it runs".into()),
        Loader::Create if named && p.loaders & (loader::NAMED | loader::CREATOR) == 0 => {
            return refuse(format!("the image takes no library from its creator, not even {name}, which it names"))
        }
        Loader::Create if !named && p.loaders & loader::CREATOR == 0 => {
            let names: Vec<&str> = manifest.devices().iter().filter(|d| d.kind == DeviceKind::Library as u32).map(|d| d.name()).collect();
            return refuse(format!("the image takes only the libraries it names ({}), not {name}", if names.is_empty() { "none".into() } else { names.join(", ") }));
        }
        _ => {}
    }
    let [major, minor, patch, _] = p.min_version;
    let min_version = (p.min_version != [0; 4]).then_some(Version { major, minor, patch });
    Policy { keys: p.keys().to_vec(), min_version }.check(signed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];

    fn signed(key: [u8; 32], major: u16) -> Option<Signed> {
        Some(Signed { version: Version { major, minor: 0, patch: 0 }, key })
    }

    fn policy(loaders: u32) -> LibPolicy {
        let mut p = LibPolicy::new().min_version(1, 0, 0).loaders(loaders);
        p.keys[0] = KEY;
        p.key_count = 1;
        p
    }

    fn refused(r: Result<(), LibraryError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn who_may_supply_a_library() {
        let m = ImageNote::new().library("hello");
        let ok = signed(KEY, 1);
        // No policy: anything from anyone.
        assert!(allowed(&m, None, "other", None, Loader::Update).is_ok());
        let named_only = policy(loader::NAMED);
        assert!(allowed(&m, Some(&named_only), "hello", ok.as_ref(), Loader::Create).is_ok());
        assert_eq!(
            refused(allowed(&m, Some(&named_only), "bench", ok.as_ref(), Loader::Create)),
            "refused by the image's policy: the image takes only the libraries it names (hello), not bench"
        );
        assert_eq!(
            refused(allowed(&m, Some(&named_only), "hello", ok.as_ref(), Loader::Update)),
            "refused by the image's policy: the image does not let its libraries be replaced while it runs"
        );
        assert!(allowed(&m, Some(&policy(loader::NAMED | loader::UPDATE)), "hello", ok.as_ref(), Loader::Update).is_ok());
        assert!(allowed(&m, Some(&policy(loader::CREATOR)), "bench", ok.as_ref(), Loader::Create).is_ok());
        assert_eq!(
            refused(allowed(&m, Some(&policy(loader::UPDATE)), "hello", ok.as_ref(), Loader::Create)),
            "refused by the image's policy: the image takes no library from its creator, not even hello, which it names"
        );
    }

    #[test]
    fn signer_and_version_as_the_policy_says() {
        let m = ImageNote::new().library("hello");
        let p = policy(loader::ALL);
        assert!(allowed(&m, Some(&p), "hello", signed(KEY, 2).as_ref(), Loader::Update).is_ok());
        assert!(refused(allowed(&m, Some(&p), "hello", None, Loader::Create)).contains("it is not signed"));
        assert!(refused(allowed(&m, Some(&p), "hello", signed([9; 32], 1).as_ref(), Loader::Create)).contains("which the image does not trust"));
        assert!(refused(allowed(&m, Some(&p), "hello", signed(KEY, 0).as_ref(), Loader::Update)).contains("version 0.0.0 is older than the 1.0.0"));
        // Keys only: any version of theirs.
        let mut keys_only = LibPolicy::new();
        keys_only.keys[0] = KEY;
        keys_only.key_count = 1;
        assert!(allowed(&m, Some(&keys_only), "hello", signed(KEY, 0).as_ref(), Loader::Create).is_ok());
    }
}
