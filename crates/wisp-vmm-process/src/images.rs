//! Where images are found: a path, or the name of a bundled app looked up
//! in the image directories (an explicit one first, then
//! `$WISP_IMAGE_DIR`, `<exe dir>/images`, an installed tree's
//! `<prefix>/share/wisp/images` (`make install`), the development tree's
//! `build/images`).

use std::path::{Path, PathBuf};

use wisp_vmm::Image;

/// Directories searched for bundled images, in order: `explicit` (wispd's
/// `--images`), `$WISP_IMAGE_DIR`, `images/` next to the executable, an
/// installed tree's `share/wisp/images` (`<prefix>/bin/<exe>` ->
/// `<prefix>/share/wisp/images`), and the development tree's
/// `build/images`.
pub fn image_dirs(explicit: Option<PathBuf>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    dirs.extend(explicit);
    if let Some(d) = std::env::var_os("WISP_IMAGE_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Some(exe_dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        dirs.push(exe_dir.join("images"));
        dirs.push(exe_dir.join("../share/wisp/images"));
        // Development tree: target/<profile>/<exe> -> build/images.
        dirs.push(exe_dir.join("../../build/images"));
    }
    dirs
}

/// Resolve IMAGE: an existing path, or the name of a bundled app.
pub fn resolve_image(image: &str) -> Result<PathBuf, String> {
    let p = Path::new(image);
    if image.contains('/') || p.exists() {
        return Ok(p.to_path_buf());
    }
    let dirs = image_dirs(None);
    if let Some(found) = dirs.iter().map(|d| d.join(image)).find(|c| c.is_file()) {
        return Ok(found);
    }
    let bundled = bundled();
    Err(format!(
        "no such image: '{image}' is neither a file nor a bundled app (bundled: {}); \
         a new app: `wisp new NAME`, then `wisp run NAME` (docs/adding-an-app.md)",
        if bundled.is_empty() { "none found; run `make` first".to_string() } else { bundled.join(", ") }
    ))
}

/// The bundled apps found in the image directories, sorted.
pub fn bundled() -> Vec<String> {
    let mut names: Vec<String> = image_dirs(None)
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok().filter(|e| e.path().is_file()).map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Resolve IMAGE and read and validate it.
pub fn load_image(image: &str) -> Result<Image, String> {
    let path = resolve_image(image)?;
    Image::from_file(&path).map_err(|e| format!("{}: {e}", path.display()))
}
