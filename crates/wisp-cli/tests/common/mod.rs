//! Helpers for the CLI tests: run `wisp` on real KVM with a hang guard.
#![allow(dead_code)]

pub mod cgroup;
pub mod daemon;
pub mod netns;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// User + system CPU time of the wisp process.
    pub cpu: Duration,
    pub wall: Duration,
}

pub fn images() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/images");
    assert!(
        dir.join("hello").is_file() && dir.join("hostile").is_file(),
        "guest images missing in {}: build them with `make guest` (make test does)",
        dir.display()
    );
    dir
}

pub fn image(name: &str) -> PathBuf {
    images().join(name)
}

/// Set up `cmd` (a `wisp` invocation) to boot VMs in its own process: the
/// test images, and never a wispd that may run on this machine.
pub fn direct(cmd: &mut Command) -> &mut Command {
    cmd.env("WISP_IMAGE_DIR", images()).env("WISP_SOCKET", "/nonexistent/wisp-test.sock")
}

/// An empty scratch directory for this test process, named after `tag`.
pub fn fresh_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wisp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Run `wisp ARGS`, killing it (and failing) if it takes longer than `limit`.
pub fn wisp_limit(args: &[&str], limit: Duration) -> Run {
    wisp_with(args, &[] as &[(&str, &str)], limit)
}

/// [`wisp_limit`] with environment variables `envs` added.
pub fn wisp_with<K: AsRef<std::ffi::OsStr>, V: AsRef<std::ffi::OsStr>>(args: &[&str], envs: &[(K, V)], limit: Duration) -> Run {
    wisp_input(args, envs, None, limit)
}

/// [`wisp_with`], with `input` (if any) written to its standard input and
/// then closed (else its standard input is empty).
pub fn wisp_input<K: AsRef<std::ffi::OsStr>, V: AsRef<std::ffi::OsStr>>(
    args: &[&str],
    envs: &[(K, V)],
    input: Option<Vec<u8>>,
    limit: Duration,
) -> Run {
    let start = Instant::now();
    let mut child = direct(Command::new(env!("CARGO_BIN_EXE_wisp")).args(args))
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn wisp");
    if let (Some(data), Some(mut w)) = (input, child.stdin.take()) {
        std::thread::spawn(move || {
            let _ = std::io::Write::write_all(&mut w, &data);
        });
    }
    let pid = child.id() as libc::pid_t;
    let out_handle = {
        let mut c = child;
        let mut so = c.stdout.take().unwrap();
        let mut se = c.stderr.take().unwrap();
        let t1 = std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut so, &mut s).ok();
            s
        });
        let t2 = std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut se, &mut s).ok();
            s
        });
        std::mem::forget(c);
        (t1, t2)
    };
    let mut status = 0;
    // SAFETY: rusage is plain data, zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: pid is our child; status and ru are valid out-pointers.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            break;
        }
        assert!(r == 0, "wait4 failed");
        if start.elapsed() > limit {
            // SAFETY: killing our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("wisp {:?} hung for more than {:?}", args, limit);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let wall = start.elapsed();
    let stdout = out_handle.0.join().unwrap();
    let stderr = out_handle.1.join().unwrap();
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    let code = if libc::WIFEXITED(status) { Some(libc::WEXITSTATUS(status)) } else { None };
    assert!(code.is_some(), "wisp {:?} died from signal {} (stderr: {stderr})", args, libc::WTERMSIG(status));
    Run { code, stdout, stderr, cpu: tv(ru.ru_utime) + tv(ru.ru_stime), wall }
}

pub fn wisp(args: &[&str]) -> Run {
    wisp_limit(args, Duration::from_secs(30))
}

/// A VM's console output so far, through the daemon.
pub fn console(c: &mut wisp_api::client::Client, id: &str) -> String {
    let mut out = Vec::new();
    c.logs(id, false, &mut |d| {
        out.extend_from_slice(d);
        true
    })
    .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// Poll `f` until it gives a value; fail (saying `what` did not happen)
/// after `limit`.
pub fn eventually<T>(limit: Duration, what: impl Fn() -> String, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t.elapsed() < limit, "{}", what());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Wait (20 s at most) until a VM's console contains `needle`.
pub fn wait_console(c: &mut wisp_api::client::Client, id: &str, needle: &str) {
    let what = || format!("'{needle}' never appeared on {id}'s console");
    eventually(Duration::from_secs(20), what, || console(c, id).contains(needle).then_some(()));
}

/// The Unix SEQPACKET sockets of process `pid`'s network namespace, as
/// `/proc/*/fd` names them (`socket:[INODE]`): family uplinks are the only
/// ones wispd makes.
pub fn seqpacket_sockets(pid: u32) -> Vec<String> {
    let unix = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap();
    unix.lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() > 6 && cols[4] == "0005").then(|| format!("socket:[{}]", cols[6]))
        })
        .collect()
}

/// The open descriptors of process `pid`: number and what it refers to
/// (`/dev/kvm`, `anon_inode:kvm-vm`, `socket:[123]`, a path...).
pub fn fds(pid: u32) -> Vec<(i32, String)> {
    let mut v: Vec<(i32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"))
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().parse().ok()?;
            Some((n, std::fs::read_link(e.path()).ok()?.to_string_lossy().into_owned()))
        })
        .collect();
    v.sort();
    v
}

/// What a forked VM's monitor process may hold besides standard input,
/// output and error and `extra`: its KVM handle, VM and vCPU, and its
/// control block's eventfd. Panics with the list otherwise.
pub fn assert_only_own_fds(pid: u32, extra: &[&dyn Fn(&str) -> bool]) {
    let all = fds(pid);
    let own = |t: &str| {
        ["/dev/kvm", "anon_inode:kvm-vm", "anon_inode:kvm-vcpu:0", "anon_inode:[eventfd]"].contains(&t)
            || extra.iter().any(|f| f(t))
    };
    let foreign: Vec<_> = all.iter().filter(|(n, t)| *n > 2 && !own(t)).collect();
    assert!(foreign.is_empty(), "process {pid} holds descriptors that are not its own: {foreign:?} (all: {all:?})");
    for one in ["/dev/kvm", "anon_inode:kvm-vm", "anon_inode:kvm-vcpu:0", "anon_inode:[eventfd]"] {
        let n = all.iter().filter(|(_, t)| t == one).count();
        assert_eq!(n, 1, "process {pid}: {n} of {one}: {all:?}");
    }
}

/// A Redis protocol (RESP2) client in Python, for tests that drive a
/// `kvstore` guest from a script: `connect(host, port)` gives a connection,
/// `cmd(conn, *words)` sends one request and returns its reply (a simple
/// string or bulk string as `str`, an integer as `int`, a nil as `None`,
/// an array as a list, an error as `"ERR:..."`).
#[allow(dead_code)]
pub const PY_RESP: &str = r#"
import socket
def connect(host, port):
    s = socket.create_connection((host, port), timeout=10)
    return (s, s.makefile("rb"))
def _reply(f):
    line = f.readline()
    t, rest = line[:1], line[1:-2]
    if t == b"+": return rest.decode()
    if t == b"-": return "ERR:" + rest.decode()
    if t == b":": return int(rest)
    if t == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2].decode()
    if t == b"*": return [_reply(f) for _ in range(int(rest))]
    raise Exception("not a RESP reply: %r" % line)
def cmd(c, *words):
    ws = [w if isinstance(w, bytes) else str(w).encode() for w in words]
    c[0].sendall(b"*%d\r\n" % len(ws) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in ws))
    return _reply(c[1])
def info(c, section):
    return dict(l.split(":", 1) for l in cmd(c, "INFO", section).split("\r\n") if ":" in l)
"#;
