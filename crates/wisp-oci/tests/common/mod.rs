//! What the OCI runtime's tests share: the runtime binary, wisp images
//! from `make guest` packed as OCI images (`podman import`), podman with
//! the ulimits this sandbox needs (`../shared/MACHINE.md`), and reading
//! a process's state.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub fn runtime() -> &'static str {
    env!("CARGO_BIN_EXE_wisp-oci")
}

/// A wisp image built by `make guest`.
pub fn image_file(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/images").join(name);
    assert!(p.is_file(), "{} missing: build the guest images with `make guest` (make test does)", p.display());
    p
}

/// A scratch directory for this test process.
pub fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wisp-oci-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Run a command, failing the test if it cannot be spawned.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// podman with wisp-oci as its runtime (`--runtime`), the sandbox's ulimits
/// added to `run`.
pub fn podman(args: &[&str]) -> Output {
    let mut c = Command::new("podman");
    c.args(["--runtime", runtime()]);
    match args.split_first() {
        Some((&"run", rest)) => {
            c.args(["run", "--pull=never", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]).args(rest);
        }
        _ => {
            c.args(args);
        }
    }
    run(&mut c)
}

/// An OCI image (in podman's store) whose root filesystem holds `files`
/// (path in the root filesystem, bytes), with `/wisp/image` as its
/// entrypoint; removed on drop.
pub struct OciImage {
    pub name: String,
}

impl OciImage {
    pub fn new(tag: &str, files: &[(&str, Vec<u8>)]) -> OciImage {
        let dir = scratch(&format!("rootfs-{tag}-{}", std::thread::current().name().unwrap_or("t").replace("::", "-")));
        for (path, bytes) in files {
            let p = dir.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, bytes).unwrap();
        }
        // One name per instance: `podman rmi -f` on drop also removes the
        // containers of its image, which must be this test's only.
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("localhost/wisp-oci-test-{tag}:{}-{n}", std::process::id());
        let tar = dir.with_extension("tar");
        let o = run(Command::new("tar").arg("-C").arg(&dir).arg("-cf").arg(&tar).arg("."));
        assert!(o.status.success(), "tar: {}", text(&o.stderr));
        let o = run(Command::new("podman").args(["import", "--change", "ENTRYPOINT [\"/wisp/image\"]"]).arg(&tar).arg(&name));
        assert!(o.status.success(), "podman import: {}", text(&o.stderr));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_file(&tar);
        OciImage { name }
    }

    /// The wisp image `app` (from build/images) at /wisp/image.
    pub fn app(app: &str) -> OciImage {
        OciImage::new(app, &[("/wisp/image", std::fs::read(image_file(app)).unwrap())])
    }
}

impl Drop for OciImage {
    fn drop(&mut self) {
        let _ = Command::new("podman").args(["rmi", "-f", &self.name]).output();
    }
}

/// Poll `f` until it gives a value or `limit` passes.
pub fn until<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` lives (and is not a zombie).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 1..].split_whitespace().next().unwrap_or("").to_string()))
        .is_some_and(|state| state != "Z" && state != "X")
}

/// The runtime's state directory for a container run by podman (which
/// passes no --root).
pub fn state_dir(id: &str) -> PathBuf {
    Path::new("/run/wisp-oci").join(id)
}
