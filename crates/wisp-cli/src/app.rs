//! Writing apps: `wisp new NAME [--net]` makes an app crate from the
//! template shipped with the library OS (`guest/libos/template/`, built
//! into this binary), and `wisp build [PATH]` builds a crate for the guest
//! target wherever it lives and names the image it made (`wisp run DIR`
//! does the same first). Cargo does the building; this only picks its
//! target and reads its JSON messages for the artifact.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The guest target every image is built for.
pub const GUEST_TARGET: &str = "x86_64-unknown-none";

const CARGO_TOML: &str = include_str!("../../../guest/libos/template/Cargo.toml.in");
const CARGO_CONFIG: &str = include_str!("../../../guest/libos/template/cargo-config.toml");
const MAIN_RS: &str = include_str!("../../../guest/libos/template/main.rs");
const NET_RS: &str = include_str!("../../../guest/libos/template/net.rs");

/// Where the library OS's source is: `$WISP_LIBOS`, the tree this binary
/// was built from, or the development tree beside it.
fn libos_dir() -> Result<PathBuf, String> {
    let is_libos = |d: &Path| d.join("Cargo.toml").is_file() && d.join("src/lib.rs").is_file();
    if let Some(d) = std::env::var_os("WISP_LIBOS").map(PathBuf::from) {
        return if is_libos(&d) { d.canonicalize().map_err(|e| format!("WISP_LIBOS={}: {e}", d.display())) } else { Err(format!("WISP_LIBOS={} is not the library OS's directory (guest/libos)", d.display())) };
    }
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest/libos");
    let beside = std::env::current_exe().ok().and_then(|e| e.parent().map(|p| p.join("../../guest/libos")));
    [Some(built_from), beside]
        .into_iter()
        .flatten()
        .find(|d| is_libos(d))
        .and_then(|d| d.canonicalize().ok())
        .ok_or_else(|| "cannot find the library OS's source (guest/libos of a wisp checkout): set WISP_LIBOS to it".into())
}

/// `wisp new`: make the app crate `path` (its last component is the
/// app's name). Returns what to tell the user.
pub fn new(path: &Path, net: bool) -> Result<String, String> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && name.len() <= 64;
    if !valid {
        return Err(format!("'{name}' is not an app name: a letter, then letters, digits, '-' or '_' (at most 64)"));
    }
    if path.symlink_metadata().is_ok() {
        return Err(format!("{} exists already", path.display()));
    }
    let libos = libos_dir()?;
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let parent = parent.canonicalize().map_err(|e| format!("{}: {e}", parent.display()))?;
    // Inside a wisp checkout's guest/apps: a member of its workspace.
    let in_tree = parent.join("../libos").canonicalize().is_ok_and(|d| d == libos);
    // (Into a TOML basic string: backslashes and quotes escaped.)
    let libos_toml = libos.display().to_string().replace('\\', "\\\\").replace('"', "\\\"");
    let fill = |t: &str| t.replace("@NAME@", name).replace("@LIBOS@", &libos_toml);
    let manifest = if in_tree {
        format!(
            "[package]\nname = \"{name}\"\nedition.workspace = true\nversion.workspace = true\nlicense.workspace = true\n\n\
             [dependencies]\nwisp-libos = {{ path = \"../../libos\" }}\n"
        )
    } else {
        fill(CARGO_TOML)
    };
    let write = |rel: &str, text: &str| -> Result<(), String> {
        let f = path.join(rel);
        std::fs::create_dir_all(f.parent().unwrap_or(path)).map_err(|e| format!("{}: {e}", f.display()))?;
        std::fs::write(&f, text).map_err(|e| format!("{}: {e}", f.display()))
    };
    let made = (|| {
        write("Cargo.toml", &manifest)?;
        write("src/main.rs", &fill(if net { NET_RS } else { MAIN_RS }))?;
        if !in_tree {
            write(".cargo/config.toml", &fill(CARGO_CONFIG))?;
            write(".gitignore", "/target\n")?;
            // The library OS's own lock file: the same versions of its
            // dependencies, and a build that needs no registry when they
            // are cached already.
            if let Ok(lock) = std::fs::read_to_string(libos.join("../../Cargo.lock")) {
                write("Cargo.lock", &lock)?;
            }
        }
        Ok(())
    })();
    if let Err(e) = made {
        let _ = std::fs::remove_dir_all(path);
        return Err(e);
    }
    let how = if in_tree {
        format!("`make guest` builds it with the bundled apps; `wisp run {name}`")
    } else {
        let run = if path.is_absolute() || path.starts_with(".") { path.display().to_string() } else { format!("./{}", path.display()) };
        format!("`wisp run {run}` builds and boots it (or `cd {} && cargo build --release`)", path.display())
    };
    Ok(format!("wisp: made {} ({}): {how}", path.display(), if net { "a TCP server" } else { "an app" }))
}

/// Whether `path` is a crate directory (rather than an image file).
pub fn is_crate(path: &Path) -> bool {
    path.is_dir() && path.join("Cargo.toml").is_file()
}

/// Whether `wisp run`'s IMAGE names a crate to build: a path (with a `/`,
/// or `.`) to a crate directory. A bare name is a bundled app even if a
/// directory of that name is here.
pub fn is_crate_path(image: &str) -> bool {
    (image.contains('/') || image == ".") && is_crate(Path::new(image))
}

/// `wisp build`: build the crate at `dir` for the guest target (release
/// profile) and return the image's path. Cargo's progress and errors go
/// to stderr as usual.
pub fn build(dir: &Path) -> Result<PathBuf, String> {
    if !is_crate(dir) {
        return Err(format!(
            "{} is not a crate (no Cargo.toml): make an app with `wisp new NAME`, then `wisp build NAME`",
            dir.display()
        ));
    }
    let manifest = dir.join("Cargo.toml").canonicalize().map_err(|e| format!("{}: {e}", dir.display()))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .args(["build", "--release", "--target", GUEST_TARGET, "--message-format=json-render-diagnostics", "--manifest-path"])
        .arg(&manifest)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e} (install Rust with rustup)", cargo.to_string_lossy()))?;
    if !out.status.success() {
        return Err(format!("building {} failed (cargo's messages above): no image", dir.display()));
    }
    let image = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["manifest_path"].as_str().map(Path::new) == Some(manifest.as_path()))
        .filter_map(|m| m["executable"].as_str().map(PathBuf::from))
        .last()
        .ok_or_else(|| format!("building {} made no executable: is it an app (src/main.rs with wisp::main!)?", dir.display()))?;
    // Refused now rather than at the first run.
    let img = wisp_vmm::Image::from_file(&image).map_err(|e| format!("{}: {e}", image.display()))?;
    eprintln!("wisp: image {} ({} KiB)", image.display(), img.bytes.len().div_ceil(1024));
    Ok(image)
}
