//! Writing an app as a new user would: `wisp new` outside the repository,
//! a plain `cargo build --release`, `wisp build`, `wisp run DIR`, the
//! network template served through wispd; and the guard rails around
//! `wisp run` and the build.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::daemon::Daemon;
use common::{fresh_dir, wait_console, wisp, wisp_with};

/// Builds of the apps made here share one target directory, so the
/// library OS is compiled once for all of them (and kept between runs).
fn target_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/app-tests")
}

fn build_env() -> [(&'static str, PathBuf); 1] {
    [("CARGO_TARGET_DIR", target_dir())]
}

/// A new app's directory in a scratch directory outside the repository.
fn new_app(tag: &str, name: &str, net: bool) -> PathBuf {
    let dir = fresh_dir(tag).join(name);
    let p = dir.to_str().unwrap();
    let args: Vec<&str> = if net { vec!["new", "--net", p] } else { vec!["new", p] };
    let r = wisp(&args);
    assert_eq!(r.code, Some(0), "wisp new: {}", r.stderr);
    assert!(r.stdout.contains("wisp run"), "it says how to run it: {}", r.stdout);
    dir
}

#[test]
fn an_app_made_by_wisp_new_outside_the_repository_builds_and_runs() {
    let app = new_app("app-new", "wc", false);
    for f in ["Cargo.toml", "src/main.rs", ".cargo/config.toml", "Cargo.lock"] {
        assert!(app.join(f).is_file(), "{f} missing");
    }
    let manifest = std::fs::read_to_string(app.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("[workspace]") && manifest.contains("wisp-libos"), "{manifest}");
    // The plain cargo command, in the app's directory, makes the image.
    let st = Command::new(env!("CARGO"))
        .args(["build", "--release", "--quiet"])
        .current_dir(&app)
        .envs(build_env())
        .status()
        .unwrap();
    assert!(st.success(), "cargo build --release in {}", app.display());
    let image = target_dir().join("x86_64-unknown-none/release/wc");
    let r = wisp(&["run", image.to_str().unwrap(), "--", "a", "b"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.stdout, "Hello from wc! args: [\"a\", \"b\"]\n");
    let r = wisp(&["inspect", image.to_str().unwrap()]);
    assert!(r.stdout.contains("placed:    position-independent, at 0x100000"), "{}", r.stdout);
    // Edited, it is built again by `wisp run DIR`.
    let main = std::fs::read_to_string(app.join("src/main.rs")).unwrap();
    std::fs::write(app.join("src/main.rs"), main.replace("Hello from wc!", "Counting:")).unwrap();
    let r = wisp_with(&["run", app.to_str().unwrap(), "--", "x"], &build_env(), Duration::from_secs(300));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.stdout, "Counting: args: [\"x\"]\n");
    assert!(r.stderr.contains("wisp: image ") && r.stderr.contains("/release/wc"), "{}", r.stderr);
    let _ = std::fs::remove_dir_all(app.parent().unwrap());
}

#[test]
fn the_network_template_serves_through_wispd() {
    let app = new_app("app-net", "upper", true);
    let r = wisp_with(&["build", app.to_str().unwrap()], &build_env(), Duration::from_secs(300));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let image = PathBuf::from(r.stdout.trim());
    assert!(image.is_file(), "wisp build printed {:?}", r.stdout);
    let r = wisp(&["inspect", image.to_str().unwrap()]);
    assert!(r.stdout.contains("net0 (net, required)"), "{}", r.stdout);
    let d = Daemon::start_in_netns("app-net", "10.77.31.0/24", &[]);
    let out = d.wisp(&["run", "-d", "--net", "-p", "8070:7070", image.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut c = d.client();
    wait_console(&mut c, &id, "upper: listening on 10.77.31.");
    let said = d.python(
        "import socket; s=socket.create_connection(('127.0.0.1',8070),timeout=10); s.sendall(b'hello wisp\\n'); \
         b=b''\nwhile not b.endswith(b'\\n'): b+=s.recv(100)\nprint(b.decode().strip())",
    );
    assert_eq!(said.trim(), "HELLO WISP");
    let _ = std::fs::remove_dir_all(app.parent().unwrap());
}

#[test]
fn an_app_made_in_the_repository_joins_its_workspace() {
    // A checkout's layout (guest/libos, guest/apps) with the real library OS.
    let tree = fresh_dir("app-tree");
    std::fs::create_dir_all(tree.join("guest/apps")).unwrap();
    let libos = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../guest/libos");
    std::os::unix::fs::symlink(libos.canonicalize().unwrap(), tree.join("guest/libos")).unwrap();
    let dir = tree.join("guest/apps/tally");
    let r = wisp_with(&["new", dir.to_str().unwrap()], &[("WISP_LIBOS", tree.join("guest/libos"))], Duration::from_secs(30));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("edition.workspace = true") && manifest.contains("path = \"../../libos\""), "{manifest}");
    assert!(!manifest.contains("[workspace]") && !dir.join(".cargo").exists(), "{manifest}");
    assert!(r.stdout.contains("make guest"), "{}", r.stdout);
    let _ = std::fs::remove_dir_all(&tree);
}

#[test]
fn wisp_new_refuses_bad_names_and_existing_directories() {
    let dir = fresh_dir("app-bad");
    let bad = dir.join("9lives");
    let r = wisp(&["new", bad.to_str().unwrap()]);
    assert_eq!(r.code, Some(125));
    assert!(r.stderr.contains("is not an app name"), "{}", r.stderr);
    assert!(!bad.exists());
    let r = wisp(&["new", dir.to_str().unwrap()]);
    assert!(r.stderr.contains("exists already"), "{}", r.stderr);
    let r = wisp(&["build", dir.to_str().unwrap()]);
    assert_eq!(r.code, Some(125));
    assert!(r.stderr.contains("is not a crate") && r.stderr.contains("wisp new"), "{}", r.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_guest_crate_built_for_the_host_says_how_to_build_it() {
    let out = Command::new(env!("CARGO"))
        .args(["check", "--quiet", "-p", "hello", "--target-dir"])
        .arg(target_dir().join("host-check"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("wisp-libos builds only for the guest target") && err.contains("wisp build"), "{err}");
}

#[test]
fn a_failed_guest_build_leaves_no_stale_image() {
    let dir = fresh_dir("app-stale");
    std::fs::write(dir.join("hello"), b"an image from an earlier build").unwrap();
    // `make guest` whose cargo fails (`false`), with its images here.
    let out = Command::new("make")
        .args(["-s", "guest", "CARGO=false", "GUEST_APPS=hello", "TEST_IMAGES=", "TEST_PACKAGES="])
        .arg(format!("IMAGES={}", dir.display()))
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .output()
        .unwrap();
    assert!(!out.status.success(), "the build was to fail");
    assert!(!dir.join("hello").exists(), "the old image is still there to be run");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_guard_rails() {
    // An argument after the image: the `--` it needs.
    let r = wisp(&["run", "hello", "a", "b"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("go after `--`: wisp run hello -- a b"), "{}", r.stderr);
    // An unknown option is not an argument for the guest.
    let r = wisp(&["run", "--nett", "hello"]);
    assert_eq!(r.code, Some(2));
    assert!(!r.stderr.contains("go after `--`"), "{}", r.stderr);
    // Memory without a unit.
    let r = wisp(&["run", "--mem", "64", "hello"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("'64' has no unit: write 64M"), "{}", r.stderr);
    // A tap that is not there is not made.
    let r = wisp(&["run", "--tap", "wispnotap0", "--ip", "10.9.9.2/24", "hello"]);
    assert_eq!(r.code, Some(125));
    assert!(r.stderr.contains("no such tap device 'wispnotap0'"), "{}", r.stderr);
    assert!(!Path::new("/sys/class/net/wispnotap0").exists(), "a tap was made");
    let r = wisp(&["run", "--tap", "lo", "--ip", "10.9.9.2/24", "hello"]);
    assert!(r.stderr.contains("'lo' is a network device but not a tap"), "{}", r.stderr);
    // No such image: how to add one.
    let r = wisp(&["run", "wordcount"]);
    assert_eq!(r.code, Some(125));
    assert!(r.stderr.contains("no such image") && r.stderr.contains("wisp new NAME"), "{}", r.stderr);
    // The help lists the apps of the build.
    let r = wisp(&["run", "--help"]);
    let line = r.stdout.lines().find(|l| l.starts_with("Bundled apps")).unwrap_or_else(|| panic!("{}", r.stdout));
    for app in ["hello", "noop", "sleeper", "daytime", "echo", "iperf", "family", "kvstore"] {
        assert!(line.contains(app), "{app} missing: {line}");
    }
}
