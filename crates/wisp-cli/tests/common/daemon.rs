//! A real wispd for a test: its own socket, state directory and log, and
//! (for tests that forward ports) its own network namespace, which the
//! daemon's bridge and forwards never leave. Stopped and cleaned up on drop.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use wisp_api::client::Client;

pub struct Daemon {
    child: Child,
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// The network namespace it runs in, if any.
    pub netns: Option<String>,
}

fn bin(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_wisp")).with_file_name(name)
}

fn images() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/images")
}

fn run_ok(cmd: &mut Command) {
    let st = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(st.success(), "{cmd:?} failed");
}

impl Daemon {
    /// wispd with `args` added, in this test's network namespace.
    pub fn start(tag: &str, args: &[&str]) -> Daemon {
        Self::launch(tag, None, args)
    }

    /// wispd in a new network namespace of its own (bridge `wisp0` on
    /// `subnet`), with `args` added.
    pub fn start_in_netns(tag: &str, subnet: &str, args: &[&str]) -> Daemon {
        let ns = format!("wisp-api-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &ns]).stderr(Stdio::null()).status();
        run_ok(Command::new("ip").args(["netns", "add", &ns]));
        run_ok(Command::new("ip").args(["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]));
        let mut all = vec!["--subnet", subnet, "--bridge", "wisp0"];
        all.extend_from_slice(args);
        Self::launch(tag, Some(ns), &all)
    }

    fn launch(tag: &str, netns: Option<String>, args: &[&str]) -> Daemon {
        assert!(bin("wispd").exists(), "wispd not built next to wisp");
        assert!(images().join("noop").is_file(), "guest images missing: `make guest`");
        let dir = std::env::temp_dir().join(format!("wispd-api-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Other users' tests reach the socket through it.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let socket = dir.join("wispd.sock");
        let mut cmd = match &netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(bin("wispd"));
                c
            }
            None => Command::new(bin("wispd")),
        };
        cmd.arg("--socket").arg(&socket).arg("--state-dir").arg(dir.join("state")).arg("--images").arg(images());
        if !args.contains(&"--pool") {
            cmd.args(["--pool", "16M=1"]);
        }
        let child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("wispd.log")).unwrap())
            .spawn()
            .expect("spawn wispd");
        let mut d = Daemon { child, dir, socket, netns };
        let t = Instant::now();
        while Client::connect(&d.socket).and_then(|mut c| c.version().map_err(std::io::Error::other)).is_err() {
            if let Ok(Some(st)) = d.child.try_wait() {
                panic!("wispd exited ({st}): {}", d.log());
            }
            assert!(t.elapsed() < Duration::from_secs(10), "wispd did not come up: {}", d.log());
            std::thread::sleep(Duration::from_millis(10));
        }
        d
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    /// What wispd has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("wispd.log")).unwrap_or_default()
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

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&self.socket) {
            for v in c.list().unwrap_or_default() {
                let _ = c.remove(&v.id, true);
            }
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        if let Some(ns) = &self.netns {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
