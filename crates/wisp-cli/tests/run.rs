//! `wisp run` and `wisp inspect` on real KVM: the bundled apps, exit codes,
//! timeouts, the idle hypercall, and clear errors for bad requests.

mod common;

use std::time::Duration;

use common::{fresh_dir, image, images, wisp, wisp_limit};

#[test]
fn noop_exits_zero_silently() {
    let r = wisp(&["run", "noop"]);
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    assert_eq!(r.stdout, "");
    assert_eq!(r.stderr, "");
}

#[test]
fn hello_prints_its_arguments_and_uptime() {
    let r = wisp(&["run", "hello", "--", "a", "b c", "ü"]);
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    assert!(r.stdout.starts_with("Hello from wisp! args: [\"a\", \"b c\", \"ü\"]\n"), "{}", r.stdout);
    let line = r.stdout.lines().nth(1).unwrap();
    assert!(line.starts_with("booted ") && line.contains(" ms ago, 16 MiB RAM, wall clock 20"), "{line}");
}

#[test]
fn image_by_path_and_memory_size() {
    let path = image("hello");
    let r = wisp(&["run", "--mem", "64M", path.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    assert!(r.stdout.contains("64 MiB RAM"), "{}", r.stdout);
    // Rounded up to a whole 2 MiB page.
    let r = wisp(&["run", "--mem", "5M", "hello"]);
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    assert!(r.stdout.contains("6 MiB RAM"), "{}", r.stdout);
}

#[test]
fn guest_exit_code_is_wisps() {
    for code in ["0", "1", "7", "255"] {
        let r = wisp(&["run", "hostile", "--", "exit", code]);
        assert_eq!(r.code, Some(code.parse().unwrap()), "stderr: {}", r.stderr);
    }
}

#[test]
fn panic_prints_message_and_exits_nonzero() {
    let r = wisp(&["run", "hostile", "--", "panic"]);
    assert_eq!(r.code, Some(101));
    // On the guest's standard error, not its standard output.
    assert!(r.stderr.contains("panicked at") && r.stderr.contains("deliberate panic"), "{}", r.stderr);
    assert!(!r.stdout.contains("panicked"), "{}", r.stdout);
    let r = wisp(&["run", "--mem", "8M", "hostile", "--", "oom"]);
    assert_eq!(r.code, Some(101));
    assert!(r.stderr.contains("memory allocation of"), "{}", r.stderr);
}

#[test]
fn sleeper_sleeps_without_using_cpu() {
    let r = wisp(&["run", "sleeper", "--", "600ms", "100ms"]);
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    assert!(r.stdout.contains("sleeper: done after 6 wakes"), "{}", r.stdout);
    assert!(r.wall >= Duration::from_millis(600), "slept only {:?}", r.wall);
    // Parked in the idle hypercall, the VM uses no CPU; spinning would
    // burn the whole 600 ms.
    assert!(r.cpu < Duration::from_millis(150), "used {:?} of CPU while sleeping", r.cpu);
}

#[test]
fn many_timers_share_idle_calls() {
    let r = wisp(&["run", "hostile", "--", "timers"]);
    assert_eq!(r.code, Some(0), "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("50 fired, in order: true"), "{}", r.stdout);
}

#[test]
fn guest_clock_matches_host() {
    let r = wisp(&["run", "hostile", "--", "clock"]);
    assert_eq!(r.code, Some(0));
    let skew: u64 = r.stdout.split("skew ").nth(1).and_then(|s| s.split(' ').next()).unwrap().parse().unwrap();
    assert!(skew <= 5, "guest wall clock is {skew} ms off the host's");
}

#[test]
fn large_console_output_arrives_whole() {
    let r = wisp(&["run", "hostile", "--", "big-console"]);
    assert_eq!(r.code, Some(0));
    assert_eq!(r.stdout.matches('x').count(), 100_000);
}

#[test]
fn timeout_ends_a_spinning_guest() {
    let r = wisp(&["run", "--timeout", "500ms", "hostile", "--", "spin"]);
    assert_eq!(r.code, Some(124));
    assert!(r.stderr.contains("timeout"), "{}", r.stderr);
    assert!(r.wall >= Duration::from_millis(500));
    // A sleeping guest is ended too.
    let r = wisp(&["run", "--timeout", "300ms", "sleeper"]);
    assert_eq!(r.code, Some(124));
    assert!(r.cpu < Duration::from_millis(150), "idle guest used {:?} CPU", r.cpu);
}

#[test]
fn inspect_shows_entry_segments_and_abi() {
    let r = wisp(&["inspect", "hello"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    // The ABI version the image was built for (this tree's).
    assert!(r.stdout.contains(&format!("abi:       wisp v{} ", wisp_abi::ABI_VERSION)), "{}", r.stdout);
    assert!(r.stdout.contains("entry:     0x10"), "{}", r.stdout);
    assert!(r.stdout.contains("r-x"), "{}", r.stdout);
    assert!(r.stdout.contains("rw-"), "{}", r.stdout);
}

#[test]
fn bundled_images_are_small() {
    let size = std::fs::metadata(images().join("hello")).unwrap().len();
    assert!(size <= 200 * 1024, "hello is {size} bytes");
}

fn assert_error(args: &[&str], needle: &str) {
    let r = wisp_limit(args, Duration::from_secs(20));
    assert_eq!(r.code, Some(125), "{args:?}: stdout {} stderr {}", r.stdout, r.stderr);
    assert!(r.stderr.starts_with("wisp: error: "), "{args:?}: {}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{args:?}: not one line: {}", r.stderr);
    assert!(r.stderr.contains(needle), "{args:?}: expected '{needle}' in: {}", r.stderr);
}

#[test]
fn bad_requests_get_one_line_errors() {
    assert_error(&["run", "/nonexistent/image"], "No such file");
    assert_error(&["run", "no-such-app"], "no such image");
    assert_error(&["run", "/tmp"], "not a regular file");
    assert_error(&["run", "/dev/zero"], "not a regular file");
    assert_error(&["run", "--mem", "1M", "hello"], "memory too small");
    assert_error(&["run", "--mem", "100G", "hello"], "memory too large");
    assert_error(&["inspect", "/nonexistent"], "No such file");
}

#[test]
fn bad_flags_are_usage_errors() {
    let r = wisp(&["run", "--mem", "lots", "hello"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("not a size"), "{}", r.stderr);
    let r = wisp(&["run", "--timeout", "soon", "hello"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("not a duration"), "{}", r.stderr);
}

#[test]
fn no_access_to_dev_kvm_is_a_clear_error() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !std::path::Path::new("/usr/bin/setpriv").exists() {
        panic!("this test needs root and setpriv (util-linux) to drop privileges");
    }
    // What the unprivileged user runs, copied where it can read it: the
    // checkout may lie under a directory only root may enter.
    let dir = fresh_dir("no-kvm");
    let (wisp, noop) = (dir.join("wisp"), dir.join("noop"));
    std::fs::copy(env!("CARGO_BIN_EXE_wisp"), &wisp).unwrap();
    std::fs::copy(image("noop"), &noop).unwrap();
    for (path, mode) in [(&dir, 0o755), (&wisp, 0o755), (&noop, 0o644)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let out = std::process::Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&wisp)
        .arg("run")
        .arg(&noop)
        .env("WISP_SOCKET", "/nonexistent/wisp-test.sock")
        .current_dir("/")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("cannot open /dev/kvm"), "{stderr}");
}
