//! `wisp lib`: guest shared libraries (issue 17, `docs/libraries.md`):
//! make a signing key, sign a library with its version, and show what a
//! library is (checked as the monitor checks it).

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use wisp_vmm::library::{sign, Kind, Library, Version};

#[derive(Subcommand)]
pub enum LibCmd {
    /// Make a signing key: FILE holds its secret (hex, mode 0600); prints
    /// the public key an image names to trust it.
    Keygen {
        /// Where the key goes (a new file).
        file: PathBuf,
    },
    /// Sign a library as VERSION with the key in --key (in place, or into
    /// --out).
    Sign {
        /// A key file from `wisp lib keygen`.
        #[arg(long)]
        key: PathBuf,
        /// MAJOR.MINOR.PATCH.
        #[arg(long)]
        version: Version,
        /// Write the signed library here instead of over LIB.
        #[arg(long, short)]
        out: Option<PathBuf>,
        /// The library (an unsigned .so from `make libs`).
        lib: PathBuf,
    },
    /// Check a library as the monitor does and show its exports, version
    /// and signer.
    Inspect {
        /// The library.
        lib: PathBuf,
    },
}

pub fn run(cmd: LibCmd) -> Result<u8, String> {
    match cmd {
        LibCmd::Keygen { file } => {
            let mut seed = [0u8; 32];
            std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").map_err(|e| e.to_string())?, &mut seed).map_err(|e| e.to_string())?;
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            std::io::Write::write_all(&mut f, format!("{}\n", hex(&seed)).as_bytes()).map_err(|e| e.to_string())?;
            println!("{}", public_hex(&sign::key_from_seed(&seed)));
            Ok(0)
        }
        LibCmd::Sign { key, version, out, lib } => {
            let k = read_key(&key)?;
            let elf = std::fs::read(&lib).map_err(|e| format!("{}: {e}", lib.display()))?;
            // Only a library the monitor would take is signed.
            Library::parse(&elf).map_err(|e| format!("{}: {e}", lib.display()))?;
            let signed = sign::sign(&elf, version, &k).map_err(|e| format!("{}: {e}", lib.display()))?;
            let to = out.unwrap_or(lib);
            std::fs::write(&to, signed).map_err(|e| format!("{}: {e}", to.display()))?;
            println!("{}: version {version}, key {}", to.display(), public_hex(&k));
            Ok(0)
        }
        LibCmd::Inspect { lib } => {
            let bytes = std::fs::read(&lib).map_err(|e| format!("{}: {e}", lib.display()))?;
            let (l, signed) = Library::read(&bytes).map_err(|e| format!("{}: {e}", lib.display()))?;
            match signed {
                Some(s) => println!("version {}, signed by {}", s.version, hex(&s.key)),
                None => println!("unsigned"),
            }
            println!("{} KiB of address space, {} relocations", l.span >> 10, l.relocations.len());
            for e in &l.exports {
                println!("{} {} {:#x} {}", if e.kind == Kind::Function { "fn " } else { "var" }, e.name, e.value, e.size);
            }
            Ok(0)
        }
    }
}

/// The library at `path` as a device for a direct run: read once into a
/// sealed memfd (what is mapped is what was checked), its signature
/// verified and the ELF checked; named by the file's stem (`hello.so`:
/// `hello`).
pub fn device(path: &Path) -> Result<wisp_vmm::devices::library::LibraryDevice, String> {
    let name = path.file_stem().and_then(|s| s.to_str()).ok_or_else(|| format!("--lib {}: no name", path.display()))?;
    let bytes = std::fs::read(path).map_err(|e| format!("--lib {}: {e}", path.display()))?;
    wisp_vmm::devices::library::LibraryDevice::from_bytes(name, &bytes).map_err(|e| format!("--lib {}: {e}", path.display()))
}

fn public_hex(k: &ed25519_dalek::SigningKey) -> String {
    hex(k.verifying_key().as_bytes())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A key file: 64 hex digits (the secret seed), readable by its owner only.
fn read_key(p: &Path) -> Result<ed25519_dalek::SigningKey, String> {
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
    if m.permissions().mode() & 0o077 != 0 {
        return Err(format!("{}: a key file must be readable by its owner only (chmod 600)", p.display()));
    }
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let t = text.trim();
    let seed: Vec<u8> = (0..t.len()).step_by(2).filter_map(|i| t.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect();
    let seed: [u8; 32] = seed.try_into().ok().filter(|_| t.len() == 64).ok_or_else(|| format!("{}: not a key (64 hex digits)", p.display()))?;
    Ok(sign::key_from_seed(&seed))
}
