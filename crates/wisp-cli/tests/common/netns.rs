//! A network namespace a test makes for itself (traffic never leaves it),
//! with taps and bridges, and VMs booted inside it by `wisp run`.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use super::direct;

/// A network namespace, deleted when dropped.
pub struct NetNs {
    pub name: String,
}

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("run ip (iproute2)");
    assert!(st.success(), "ip {args:?} failed");
}

impl NetNs {
    pub fn new(tag: &str) -> NetNs {
        let name = format!("wisp-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(Stdio::null()).status();
        ip(&["netns", "add", &name]);
        let ns = NetNs { name };
        ns.exec_ok(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// A tap with the host side at `host_cidr`.
    pub fn add_tap(&self, tap: &str, host_cidr: &str) {
        self.exec_ok(&["ip", "tuntap", "add", "dev", tap, "mode", "tap"]);
        self.exec_ok(&["ip", "addr", "add", host_cidr, "dev", tap]);
        self.exec_ok(&["ip", "link", "set", tap, "up"]);
    }

    /// A bridge with the host side at `host_cidr`.
    pub fn add_bridge(&self, bridge: &str, host_cidr: &str) {
        self.exec_ok(&["ip", "link", "add", bridge, "type", "bridge"]);
        self.exec_ok(&["ip", "addr", "add", host_cidr, "dev", bridge]);
        self.exec_ok(&["ip", "link", "set", bridge, "up"]);
    }

    /// A tap attached to `bridge`.
    pub fn add_bridged_tap(&self, tap: &str, bridge: &str) {
        self.exec_ok(&["ip", "tuntap", "add", "dev", tap, "mode", "tap"]);
        self.exec_ok(&["ip", "link", "set", tap, "master", bridge]);
        self.exec_ok(&["ip", "link", "set", tap, "up"]);
    }

    /// `argv` to run inside the namespace.
    pub fn cmd(&self, argv: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(argv);
        c
    }

    pub fn exec_ok(&self, argv: &[&str]) {
        let st = self.cmd(argv).status().unwrap();
        assert!(st.success(), "{argv:?} in {} failed", self.name);
    }

    /// Boot `image` in this namespace on `tap`, in its own wisp process.
    pub fn boot(&self, tap: &str, cidr: &str, image: &str, args: &[&str]) -> Child {
        let wisp = env!("CARGO_BIN_EXE_wisp");
        let mut argv = vec![wisp, "run", "--timeout", "60s", "--tap", tap, "--ip", cidr, image, "--"];
        argv.extend_from_slice(args);
        direct(&mut self.cmd(&argv)).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// A VM's console read by a thread of its own, so every wait on it has a
/// real deadline (a blocking read cannot outlast it).
pub struct Console {
    lines: std::sync::mpsc::Receiver<String>,
}

impl Console {
    /// Take `child`'s stdout.
    pub fn of(child: &mut Child) -> Console {
        let out: ChildStdout = child.stdout.take().expect("stdout piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Console { lines }
    }

    /// Lines until one contains `needle` (returned, with the ones before);
    /// panics after `limit` or if the console ends first.
    pub fn wait_for(&self, needle: &str, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.contains(needle);
                    seen.push(l);
                    if hit {
                        return seen;
                    }
                }
                Err(e) => panic!("no '{needle}' on the console ({e:?}); got:\n{}", seen.join("\n")),
            }
        }
    }

    /// Every line until the console ends (the VM's process exits); panics
    /// after `limit`.
    pub fn rest(&self, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => seen.push(l),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return seen,
                Err(e) => panic!("the console did not end in time ({e:?})"),
            }
        }
    }
}
