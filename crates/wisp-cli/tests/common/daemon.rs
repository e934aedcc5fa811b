//! A real wispd for a test: its own socket, state directory and log, and
//! (if asked) its own network namespace, which the daemon's bridge and
//! forwards never leave. It can be SIGKILLed and restarted with the same
//! directory, socket and arguments. Stopped and cleaned up on drop, VMM
//! processes of its state directory included.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use wisp_api::client::Client;

use super::{eventually, images};

pub struct Daemon {
    child: Child,
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// The network namespace it runs in, if any.
    pub netns: Option<String>,
    /// What wispd is started with after `--socket`, `--state-dir`, `--images`.
    args: Vec<String>,
    /// The wispd binary.
    exe: PathBuf,
}

fn bin(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_wisp")).with_file_name(name)
}

fn run_ok(cmd: &mut Command) {
    let st = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(st.success(), "{cmd:?} failed");
}

impl Daemon {
    /// wispd with `args` added (`--pool 16M=1` unless they have a pool),
    /// in this test's network namespace.
    pub fn start(tag: &str, args: &[&str]) -> Daemon {
        Self::launch(tag, false, args)
    }

    /// wispd in a new network namespace of its own (bridge `wisp0` on
    /// `subnet`), with `args` added.
    pub fn start_in_netns(tag: &str, subnet: &str, args: &[&str]) -> Daemon {
        let mut all = vec!["--subnet", subnet, "--bridge", "wisp0"];
        all.extend_from_slice(args);
        Self::launch(tag, true, &all)
    }

    /// wispd with `args` added (`--pool 16M=1` unless they have a pool), in
    /// a new network namespace of its own if `own_netns`. Its directory and
    /// namespace are named after `tag` and this test process.
    pub fn launch(tag: &str, own_netns: bool, args: &[&str]) -> Daemon {
        Self::launch_exe(tag, own_netns, &bin("wispd"), args)
    }

    /// [`Daemon::launch`] of the wispd binary `exe` (a copy of the one
    /// built, say).
    pub fn launch_exe(tag: &str, own_netns: bool, exe: &Path, args: &[&str]) -> Daemon {
        assert!(exe.exists(), "{} not built", exe.display());
        assert!(images().join("noop").is_file(), "guest images missing: `make guest`");
        let dir = std::env::temp_dir().join(format!("wispd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Other users' tests reach the socket through it.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let socket = dir.join("wispd.sock");
        let netns = own_netns.then(|| {
            let ns = format!("wisp-{tag}-{}", std::process::id());
            let _ = Command::new("ip").args(["netns", "del", &ns]).stderr(Stdio::null()).status();
            run_ok(Command::new("ip").args(["netns", "add", &ns]));
            run_ok(Command::new("ip").args(["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]));
            ns
        });
        let mut all: Vec<String> = Vec::new();
        if !args.contains(&"--pool") {
            all.extend(["--pool".to_string(), "16M=1".to_string()]);
        }
        all.extend(args.iter().map(|a| a.to_string()));
        let child = Self::spawn(exe, &dir, &socket, netns.as_deref(), &all);
        let mut d = Daemon { child, dir, socket, netns, args: all, exe: exe.to_path_buf() };
        d.wait_ready();
        d
    }

    fn spawn(exe: &Path, dir: &Path, socket: &Path, netns: Option<&str>, args: &[String]) -> Child {
        let mut cmd = match netns {
            // ip netns exec execs wispd: the child is wispd itself.
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.arg("--socket").arg(socket).arg("--state-dir").arg(dir.join("state")).arg("--images").arg(images());
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("wispd.log")).unwrap();
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).spawn().expect("spawn wispd")
    }

    fn wait_ready(&mut self) {
        let (child, socket, dir) = (&mut self.child, &self.socket, &self.dir);
        let log = || std::fs::read_to_string(dir.join("wispd.log")).unwrap_or_default();
        let what = || format!("wispd did not come up: {}", log());
        eventually(Duration::from_secs(10), what, || {
            if let Ok(Some(st)) = child.try_wait() {
                panic!("wispd exited ({st}): {}", log());
            }
            Client::connect(socket).ok()?.version().ok()
        });
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    /// Its state directory.
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// VM `id`'s directory in the state directory.
    pub fn vm_dir(&self, id: &str) -> PathBuf {
        self.state().join("vms").join(id)
    }

    /// What wispd has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("wispd.log")).unwrap_or_default()
    }

    /// Kill wispd with SIGKILL (its VMs go on running).
    pub fn sigkill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Start wispd again, with the same directory, socket, namespace and
    /// arguments, and wait until it answers.
    pub fn restart(&mut self) {
        self.child = Self::spawn(&self.exe, &self.dir, &self.socket, self.netns.as_deref(), &self.args);
        self.wait_ready();
    }

    pub fn sigkill_and_restart(&mut self) {
        self.sigkill();
        self.restart();
    }

    /// `wisp ARGS` against this daemon.
    pub fn wisp(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_wisp"))
            .args(args)
            .env("WISP_SOCKET", &self.socket)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// A command run in the daemon's network namespace.
    pub fn in_netns(&self, argv: &[&str]) -> Command {
        let ns = self.netns.as_deref().expect("a daemon started in a netns");
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).args(argv);
        c
    }

    /// Run a Python script in the daemon's network namespace; its stdout,
    /// or a failure with what it said.
    pub fn python(&self, script: &str) -> String {
        let o = self.in_netns(&["python3", "-c", script]).output().unwrap();
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "script failed: {out}\n{err}");
        out.into_owned()
    }
}

/// Kill what a test's daemons under `dir` leave behind once they are gone:
/// VMM processes no daemon holds any more (a VM whose record was replaced,
/// or a test that failed) and the init process of the VMM processes' PID
/// namespace (it outlives a daemon on purpose, for a restarted one).
pub fn kill_leftovers(dir: &std::path::Path) {
    let dir = dir.as_os_str().as_encoded_bytes();
    for ent in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = ent.file_name().to_string_lossy().parse::<i32>() else { continue };
        let cmdline = std::fs::read(ent.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let ours = args.get(1) == Some(&&b"__worker"[..]) || args.contains(&&b"__pidns"[..]);
        if ours && args.iter().any(|a| a.starts_with(dir)) {
            // SAFETY: a VMM process, or the init of the VMM processes' PID
            // namespace, of this test's own state directory.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&self.socket) {
            // Whole families at once: a family that forks outruns removals
            // one by one.
            for v in c.list().unwrap_or_default() {
                let _ = c.remove_family(&v.id, true);
            }
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        kill_leftovers(&self.dir);
        if let Some(ns) = &self.netns {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        // Kept for a look when the test failed, or when asked to.
        if !std::thread::panicking() && std::env::var_os("WISP_TEST_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
