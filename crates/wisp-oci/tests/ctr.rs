//! wisp-oci under Debian's containerd (issue 19, items 2 and 4): a
//! containerd of the test's own (its own root, state and socket) runs
//! wisp images through its runc v2 shim with wisp-oci as the runc binary
//! (`ctr run --runc-binary`; Kubernetes reaches it the same way through a
//! runtime handler's `BinaryName`, `docs/oci.md`): output and exit status,
//! and a detached task listed, killed (143) and deleted.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Output};
use std::time::Duration;

use common::{run, scratch, text, until, OciImage};

struct Containerd {
    dir: PathBuf,
    child: Child,
    ns: String,
}

impl Containerd {
    fn start() -> Containerd {
        let dir = scratch("containerd");
        let config = format!(
            "version = 2\nroot = \"{0}/root\"\nstate = \"{0}/state\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = \"{0}/sock\"\n",
            dir.display()
        );
        std::fs::write(dir.join("config.toml"), config).unwrap();
        let log = std::fs::File::create(dir.join("log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("containerd (apt install containerd)");
        let c = Containerd { dir, child, ns: format!("wisp-oci-test-{}", std::process::id()) };
        until(Duration::from_secs(20), "containerd's socket answering", || c.ctr(&["version"]).status.success().then_some(()));
        c
    }

    fn ctr(&self, args: &[&str]) -> Output {
        run(Command::new("ctr").arg("-a").arg(self.dir.join("sock")).args(["-n", &self.ns]).args(args))
    }

    /// `img` (in podman's store) imported.
    fn import(&self, img: &OciImage) {
        let tar = self.dir.join("image.tar");
        let o = run(Command::new("podman").args(["save", "--format", "oci-archive", "-o"]).arg(&tar).arg(&img.name));
        assert!(o.status.success(), "podman save: {}", text(&o.stderr));
        let o = self.ctr(&["images", "import", tar.to_str().unwrap()]);
        assert!(o.status.success(), "ctr import: {}", text(&o.stderr));
        let _ = std::fs::remove_file(tar);
    }

    /// `ctr run` with wisp-oci as the shim's runc binary.
    fn run(&self, extra: &[&str], img: &OciImage, id: &str, args: &[&str]) -> Output {
        let mut a = vec!["run", "--runc-binary", common::runtime()];
        a.extend_from_slice(extra);
        a.extend_from_slice(&[&img.name, id]);
        a.extend_from_slice(args);
        self.ctr(&a)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // A failed test's tasks (their shims and VMs) go first.
        for t in text(&self.ctr(&["task", "ls", "-q"]).stdout).lines() {
            let _ = self.ctr(&["task", "delete", "-f", t]);
        }
        for c in text(&self.ctr(&["container", "ls", "-q"]).stdout).lines() {
            let _ = self.ctr(&["container", "rm", c]);
        }
        let _ = std::fs::remove_dir_all(PathBuf::from("/run/containerd/runc").join(&self.ns));
        // SAFETY: kill takes a pid and a signal number; the child is ours.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        // The shim names groups /NAMESPACE/ID: the namespace's own group
        // in each hierarchy is the test's to remove (empty by now).
        for h in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            let _ = std::fs::remove_dir(h.path().join(&self.ns));
        }
        let _ = std::fs::remove_dir(std::path::Path::new("/sys/fs/cgroup").join(&self.ns));
    }
}

#[test]
fn containerd_runs_wisp_images_and_their_tasks_end_as_processes_do() {
    let c = Containerd::start();
    let (hello, hostile, sleeper) = (OciImage::app("hello"), OciImage::app("hostile"), OciImage::app("sleeper"));
    for img in [&hello, &hostile, &sleeper] {
        c.import(img);
    }
    let o = c.run(&["--rm"], &hello, "hello", &["a", "b"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains(r#"Hello from wisp! args: ["a", "b"]"#), "{}", text(&o.stdout));
    let o = c.run(&["--rm"], &hostile, "exit7", &["exit", "7"]);
    assert_eq!(o.status.code(), Some(7), "{}", text(&o.stderr));

    let o = c.run(&["-d"], &sleeper, "sleepy", &["100", "1"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let ls = text(&c.ctr(&["task", "ls"]).stdout);
    let pid: i32 = ls.lines().find(|l| l.starts_with("sleepy ")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or_else(|| panic!("{ls}"));
    assert!(ls.contains("RUNNING") && common::alive(pid), "{ls}");
    // The shim gives wisp-oci a root of its own: the container's state is there.
    let state = PathBuf::from("/run/containerd/runc").join(&c.ns).join("sleepy");
    assert!(state.join("state.json").is_file(), "{}", state.display());
    assert!(c.ctr(&["task", "kill", "sleepy"]).status.success());
    until(Duration::from_secs(10), "the task stopped", || text(&c.ctr(&["task", "ls"]).stdout).contains("STOPPED").then_some(()));
    assert!(!common::alive(pid));
    let o = c.ctr(&["task", "delete", "sleepy"]);
    assert!(text(&o.stderr).contains("exit code 143"), "SIGTERM: {} {}", text(&o.stdout), text(&o.stderr));
    assert!(c.ctr(&["container", "rm", "sleepy"]).status.success());
    assert!(!state.exists(), "the runtime's state is deleted with the task");
    for img in [&hello, &hostile, &sleeper] {
        let _ = c.ctr(&["images", "rm", &img.name]);
    }
}
