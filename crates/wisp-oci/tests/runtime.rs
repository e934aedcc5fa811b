//! The runtime's command line on its own, as an engine drives it (issue
//! 19, items 1 and 4): create → created (the guest has not run), start →
//! running, the guest's status as the process's exit status (this test
//! process is a subreaper, as conmon and containerd's shim are, so it
//! reaps the container's process), kill as a signal, delete; wrong calls
//! and malformed bundles refused with what is wrong, leaving nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{image_file, scratch, text};

fn oci(root: &Path, args: &[&str]) -> Output {
    common::run(Command::new(common::runtime()).arg("--root").arg(root).args(args))
}

/// A bundle in `dir`: `config` as config.json, `image` at
/// rootfs/wisp/image.
fn bundle(dir: &Path, image: Option<&[u8]>, config: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("rootfs/wisp")).unwrap();
    if let Some(bytes) = image {
        std::fs::write(dir.join("rootfs/wisp/image"), bytes).unwrap();
    }
    std::fs::write(dir.join("config.json"), config).unwrap();
    dir.to_path_buf()
}

fn config(args: &[&str]) -> String {
    let args: Vec<String> = std::iter::once("/wisp/image").chain(args.iter().copied()).map(|a| format!("{a:?}")).collect();
    format!(r#"{{"ociVersion":"1.0.2","root":{{"path":"rootfs"}},"process":{{"cwd":"/","user":{{"uid":0,"gid":0}},"args":[{}]}}}}"#, args.join(","))
}

/// `create` with stdout into `console` and stderr into a file beside it
/// (the container's process keeps both: the guest's console; a pipe
/// would stay open as long as the VM). The Output's stderr is the file's.
fn create(root: &Path, bundle: &Path, id: &str, console: &Path) -> (Output, i32) {
    let f = std::fs::File::create(console).unwrap();
    let err_path = console.with_extension("stderr");
    let err = std::fs::File::create(&err_path).unwrap();
    let pid_file = bundle.join("pid");
    let mut o = Command::new(common::runtime())
        .arg("--root")
        .arg(root)
        .args(["create", "--bundle"])
        .arg(bundle)
        .arg("--pid-file")
        .arg(&pid_file)
        .arg(id)
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(err)
        .output()
        .unwrap();
    o.stderr = std::fs::read(&err_path).unwrap();
    let pid = std::fs::read_to_string(&pid_file).ok().and_then(|p| p.parse().ok()).unwrap_or(0);
    (o, pid)
}

fn state(root: &Path, id: &str) -> serde_json::Value {
    let o = oci(root, &["state", id]);
    assert!(o.status.success(), "state {id}: {}", text(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A runtime root that, dropped (a test passed or failed), force-deletes
/// whatever containers are left in it: no VM outlives its test.
struct Root(PathBuf);

impl Drop for Root {
    fn drop(&mut self) {
        for e in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            let _ = oci(&self.0, &["delete", "--force", &e.file_name().to_string_lossy()]);
        }
    }
}

impl std::ops::Deref for Root {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Root {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Root {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

/// Become a subreaper (once): orphaned container processes are ours.
fn subreaper() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) }, 0);
}

/// Reap `pid`: its raw wait status.
fn reap(pid: i32) -> i32 {
    let mut status = 0;
    // SAFETY: waitpid writes the status into a live local.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid, "{}", std::io::Error::last_os_error());
    status
}

#[test]
fn the_lifecycle_goes_as_the_runtime_spec_says() {
    subreaper();
    let d = scratch("life");
    let root = Root(d.join("root"));
    let b = bundle(&d.join("b"), Some(&std::fs::read(image_file("hostile")).unwrap()), &config(&["exit", "7"]));
    let console = d.join("console");
    let (o, pid) = create(&root, &b, "c1", &console);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(pid > 0 && common::alive(pid));
    let s = state(&root, "c1");
    assert_eq!((s["status"].as_str(), s["pid"].as_i64(), s["id"].as_str()), (Some("created"), Some(pid as i64), Some("c1")));
    assert_eq!(s["bundle"].as_str(), Some(std::fs::canonicalize(&b).unwrap().to_str().unwrap()));
    assert_eq!(std::fs::read_to_string(&console).unwrap(), "", "the guest runs only after start");
    assert!(text(&create(&root, &b, "c1", &d.join("again")).0.stderr).contains("container c1 already exists"));
    let o = oci(&root, &["start", "c1"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let status = reap(pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7, "status {status:#x}");
    assert!(std::fs::read_to_string(&console).unwrap().contains("hostile: exit"));
    let s = state(&root, "c1");
    assert_eq!(s["status"], "stopped");
    assert!(s.get("pid").is_none());
    assert!(text(&oci(&root, &["start", "c1"]).stderr).contains("container c1 is stopped, not created"));
    assert!(text(&oci(&root, &["kill", "c1"]).stderr).contains("container c1: container not running"));
    assert!(oci(&root, &["delete", "c1"]).status.success());
    assert!(text(&oci(&root, &["state", "c1"]).stderr).contains("container c1 does not exist"));
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn kill_ends_the_vm_as_a_signal_ends_a_process_and_delete_waits_for_it() {
    subreaper();
    let d = scratch("kill");
    let root = Root(d.join("root"));
    let b = bundle(&d.join("b"), Some(&std::fs::read(image_file("sleeper")).unwrap()), &config(&["100", "1"]));
    let (o, pid) = create(&root, &b, "k1", &d.join("console"));
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(oci(&root, &["start", "k1"]).status.success());
    assert_eq!(state(&root, "k1")["status"], "running");
    assert!(text(&oci(&root, &["delete", "k1"]).stderr).contains("container k1 is running"), "a running container is not deleted without --force");
    assert!(text(&oci(&root, &["kill", "k1", "SIGNOPE"]).stderr).contains("invalid signal SIGNOPE"));
    assert!(oci(&root, &["kill", "k1"]).status.success());
    let status = reap(pid);
    assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGTERM, "status {status:#x}");
    assert!(oci(&root, &["delete", "k1"]).status.success());

    // A container never started (its engine went away before `start`):
    // delete ends its waiting process; --force ends a running one.
    let (o, pid) = create(&root, &b, "k2", &d.join("console2"));
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(oci(&root, &["delete", "k2"]).status.success());
    let status = reap(pid);
    assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL, "status {status:#x}");
    let (_, pid) = create(&root, &b, "k3", &d.join("console3"));
    assert!(oci(&root, &["start", "k3"]).status.success());
    assert!(oci(&root, &["delete", "--force", "k3"]).status.success());
    let status = reap(pid);
    assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL, "status {status:#x}");
    assert!(std::fs::read_dir(&root).unwrap().next().is_none(), "nothing left in the runtime's root");
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn a_pods_sandbox_container_pauses_without_a_vm_until_it_is_stopped() {
    subreaper();
    let d = scratch("sandbox");
    let root = Root(d.join("root"));
    // The pause image is no wisp image: the CRI's annotation says what it is.
    let cfg = r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"cwd":"/","user":{"uid":0,"gid":0},"args":["/pause"]},
        "annotations":{"io.kubernetes.cri.container-type":"sandbox"}}"#;
    let b = bundle(&d.join("b"), None, cfg);
    let (o, pid) = create(&root, &b, "pod", &d.join("console"));
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(oci(&root, &["start", "pod"]).status.success());
    assert_eq!(state(&root, "pod")["status"], "running");
    assert!(oci(&root, &["kill", "pod", "TERM"]).status.success());
    let status = reap(pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "as pause: 0 after SIGTERM, status {status:#x}");
    assert!(oci(&root, &["delete", "pod"]).status.success());
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn malformed_bundles_and_wrong_calls_are_refused_with_what_is_wrong_and_leave_nothing() {
    let d = scratch("bad");
    let root = Root(d.join("root"));
    let hello = std::fs::read(image_file("hello")).unwrap();
    let good = config(&[]);
    let cases: Vec<(&str, Option<&[u8]>, String, &str)> = vec![
        ("junk", Some(&hello[..]), "{not json".into(), "config.json: key must be a string"),
        ("nouser", Some(&hello[..]), r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"cwd":"/","args":["x"]}}"#.into(), "missing field `user`"),
        ("noroot", Some(&hello[..]), r#"{"ociVersion":"1.0.2"}"#.into(), "no root"),
        ("noimage", None, good.clone(), "no wisp image at /wisp/image"),
        ("garbage", Some(b"MZ not an ELF at all"), good.clone(), "invalid image"),
        ("elf32", Some(b"\x7fELF\x01\x01\x01\0\0\0\0\0\0\0\0\0\x02\0\x03\0"), good.clone(), "invalid image"),
        (
            "mem",
            Some(&hello[..]),
            r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"linux":{"resources":{"memory":{"limit":65536}}}}"#.into(),
            "memory too small",
        ),
        (
            "tty",
            Some(&hello[..]),
            r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"terminal":true,"cwd":"/","user":{"uid":0,"gid":0}}}"#.into(),
            "no --console-socket",
        ),
    ];
    for (tag, image, cfg, want) in cases {
        let b = bundle(&d.join(tag), image, &cfg);
        let log = d.join(format!("{tag}.log"));
        let o = common::run(
            Command::new(common::runtime()).arg("--root").arg(&root).arg("--log").arg(&log).args(["--log-format", "json", "create", "--bundle"]).arg(&b).arg(tag),
        );
        assert_eq!(o.status.code(), Some(1), "{tag}");
        assert!(text(&o.stderr).contains(want), "{tag}: {}", text(&o.stderr));
        let line: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&log).unwrap().lines().last().unwrap()).unwrap();
        assert!(line["level"] == "error" && line["msg"].as_str().unwrap().contains(want), "{tag}: {line}");
        assert!(text(&oci(&root, &["state", tag]).stderr).contains("does not exist"), "{tag}: nothing is left behind");
    }
    assert!(!std::fs::read_dir(&root).map(|mut r| r.next().is_some()).unwrap_or(false), "the root holds no container");
    for args in [&["start", "nope"][..], &["kill", "nope"], &["delete", "nope"], &["state", "nope"]] {
        assert!(text(&oci(&root, args).stderr).contains("container nope does not exist"), "{args:?}");
    }
    assert!(text(&oci(&root, &["state", "../etc"]).stderr).contains("invalid container id"));
    let f: serde_json::Value = serde_json::from_slice(&oci(&root, &["features"]).stdout).unwrap();
    assert_eq!(f["linux"]["namespaces"], serde_json::json!(["network"]));
    let _ = std::fs::remove_dir_all(d);
}
