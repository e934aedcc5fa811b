//! `make install` (issue 19, item 5): the command line, the daemon and
//! the OCI runtime land in PREFIX/bin and the bundled images in
//! PREFIX/share/wisp, where the installed `wisp` finds them (here into a
//! scratch DESTDIR: the test installs nothing on the host).

mod common;

use std::path::Path;
use std::process::Command;

use common::{run, scratch, text};

#[test]
fn make_install_puts_the_binaries_on_the_path_and_the_images_where_they_are_found() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dest = scratch("install");
    let o = run(Command::new("make").arg("-C").arg(&root).arg("install").arg(format!("DESTDIR={}", dest.display())).arg("PREFIX=/usr"));
    assert!(o.status.success(), "{} {}", text(&o.stdout), text(&o.stderr));
    let bin = dest.join("usr/bin");
    for b in ["wisp", "wispd", "wisp-oci"] {
        assert!(bin.join(b).is_file(), "{b} not installed");
    }
    assert!(dest.join("usr/share/wisp/images/hello").is_file());
    // The installed wisp, on a PATH of its own, finds its bundled image by
    // name (no development tree next to it, no WISP_IMAGE_DIR).
    let o = run(Command::new("wisp")
        .args(["run", "hello", "--", "installed"])
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("WISP_SOCKET", "/nonexistent/wisp-test.sock"));
    assert!(text(&o.stdout).contains(r#"args: ["installed"]"#), "{} {}", text(&o.stdout), text(&o.stderr));
    let o = run(Command::new(bin.join("wisp-oci")).arg("features"));
    assert!(o.status.success() && text(&o.stdout).contains("ociVersionMax"));
    let o = run(Command::new("make").arg("-C").arg(&root).arg("uninstall").arg(format!("DESTDIR={}", dest.display())).arg("PREFIX=/usr"));
    assert!(o.status.success());
    assert!(!bin.join("wisp-oci").exists() && !dest.join("usr/share/wisp").exists());
    let _ = std::fs::remove_dir_all(dest);
}
