//! The virtual NIC on real KVM, inside a network namespace each test creates
//! (traffic never leaves it): ping, TCP daytime, UDP/TCP echo, and a guest
//! that corrupts its rings.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::images;

/// A network namespace with one tap (host side 10.77.N.1/24).
struct NetNs {
    name: String,
}

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("run ip (iproute2)");
    assert!(st.success(), "ip {args:?} failed");
}

impl NetNs {
    fn new(tag: &str) -> NetNs {
        let name = format!("wisp-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        ip(&["netns", "add", &name]);
        let ns = NetNs { name };
        ns.exec_ok(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    fn add_tap(&self, tap: &str, host_cidr: &str) {
        self.exec_ok(&["ip", "tuntap", "add", "dev", tap, "mode", "tap"]);
        self.exec_ok(&["ip", "addr", "add", host_cidr, "dev", tap]);
        self.exec_ok(&["ip", "link", "set", tap, "up"]);
    }

    fn cmd(&self, argv: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(argv);
        c
    }

    fn exec_ok(&self, argv: &[&str]) {
        let st = self.cmd(argv).status().unwrap();
        assert!(st.success(), "{argv:?} in {} failed", self.name);
    }

    /// Boot `image` in this namespace on `tap`, in its own wisp process.
    fn boot(&self, tap: &str, cidr: &str, image: &str, args: &[&str]) -> Child {
        let wisp = env!("CARGO_BIN_EXE_wisp");
        let mut argv = vec![wisp, "run", "--timeout", "60s", "--tap", tap, "--ip", cidr, image, "--"];
        argv.extend_from_slice(args);
        self.cmd(&argv)
            .env("WISP_IMAGE_DIR", images())
            .env("WISP_SOCKET", "/nonexistent/wisp-test.sock")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Read the VM's console until a line containing `needle` (or panic).
fn wait_line(child: &mut Child, needle: &str) -> BufReader<std::process::ChildStdout> {
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let t = Instant::now();
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "VM ended before printing '{needle}'");
        if line.contains(needle) {
            return out;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no '{needle}' in time");
    }
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn hostile_guest_corrupting_its_rings_only_loses_its_nic() {
    let ns = NetNs::new("hostile");
    ns.add_tap("wtap0", "10.77.1.1/24");
    let out = ns.boot("wtap0", "10.77.1.2/24", "hostile", &["net-corrupt"]).wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("nic stopped = 1, guest still running"), "{stdout}");
}
