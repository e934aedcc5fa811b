//! wisp-oci under Debian's podman (issue 19, items 1, 2 and 4): wisp
//! images packed as OCI images run as VMs through `podman --runtime`:
//! output, arguments, memory limit and exit status; a detached container
//! listed, logged, stopped (143) or killed (137) and removed; a port
//! published by podman reaching `daytime` in the VM; images without a
//! wisp image refused with what is wrong; and the runtime's state cleaned
//! up after the engine's monitor (conmon) was killed.

mod common;

use std::io::Read;
use std::time::Duration;

use common::{alive, podman, state_dir, text, until, OciImage};

#[test]
fn podman_runs_a_wisp_image_with_its_arguments_memory_and_exit_status() {
    let hello = OciImage::app("hello");
    let o = podman(&["run", "--rm", "-m", "64m", &hello.name, "a", "b c"]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out} {}", text(&o.stderr));
    assert!(out.contains(r#"Hello from wisp! args: ["a", "b c"]"#), "{out}");
    assert!(out.contains(", 64 MiB RAM,"), "the memory limit is the VM's RAM: {out}");

    let hostile = OciImage::app("hostile");
    let o = podman(&["run", "--rm", &hostile.name, "exit", "7"]);
    assert_eq!(o.status.code(), Some(7), "{}", text(&o.stderr));
    // A guest the monitor stops (it faults): 139, with the reason.
    let o = podman(&["run", "--rm", &hostile.name, "ud2"]);
    assert_eq!(o.status.code(), Some(139), "{} {}", text(&o.stdout), text(&o.stderr));
}

#[test]
fn stdin_environment_and_a_terminal_reach_the_guest() {
    let wc = OciImage::app("wc");
    let mut c = std::process::Command::new("podman");
    c.args(["--runtime", common::runtime(), "run", "--rm", "-i", "--pull=never", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]);
    c.args(["-e", "WC_ONLY=words", &wc.name]).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"one two\nthree\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim(), "3", "podman's stdin and -e reach the guest: {}", text(&o.stdout));
    // -t: the console on the pseudo-terminal podman asked for (its master
    // sent to conmon's console socket).
    let hello = OciImage::app("hello");
    let o = podman(&["run", "--rm", "-t", &hello.name, "tty"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains(r#"args: ["tty"]"#) && text(&o.stdout).contains("\r\n"), "through a terminal (CRLF): {:?}", text(&o.stdout));
}

#[test]
fn a_detached_container_is_listed_logged_stopped_killed_and_removed() {
    let sleeper = OciImage::app("sleeper");
    let id = text(&podman(&["run", "-d", &sleeper.name, "100", "1"]).stdout).trim().to_string();
    assert_eq!(id.len(), 64, "{id:?}");
    let ps = text(&podman(&["ps", "--no-trunc", "--format", "{{.ID}} {{.Status}}"]).stdout);
    assert!(ps.lines().any(|l| l.starts_with(&id) && l.contains(" Up ")), "{ps}");
    let logs = until(Duration::from_secs(10), "the guest's first line in podman logs", || {
        let l = text(&podman(&["logs", &id]).stdout);
        l.contains("sleeper: sleeping").then_some(l)
    });
    assert!(logs.contains("every 1s"), "{logs}");
    // The runtime's own view: running, its process the VM's.
    let st = common::run(std::process::Command::new(common::runtime()).args(["state", &id]));
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(v["status"], "running");
    let pid = v["pid"].as_i64().unwrap() as i32;
    assert!(alive(pid));
    let o = podman(&["stop", "-t", "10", &id]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&podman(&["inspect", &id, "--format", "{{.State.ExitCode}}"]).stdout).trim(), "143", "SIGTERM ends the VM's process");
    assert!(!alive(pid));
    assert!(podman(&["rm", &id]).status.success());
    assert!(!state_dir(&id).exists(), "the runtime's state is deleted with the container");

    let id = text(&podman(&["run", "-d", &sleeper.name, "100", "1"]).stdout).trim().to_string();
    assert!(podman(&["kill", "-s", "KILL", &id]).status.success());
    let code = until(Duration::from_secs(10), "the killed container's exit code", || {
        let c = text(&podman(&["inspect", &id, "--format", "{{.State.Status}} {{.State.ExitCode}}"]).stdout);
        c.starts_with("exited").then_some(c)
    });
    assert_eq!(code.trim(), "exited 137");
    assert!(podman(&["rm", &id]).status.success());
    assert!(!state_dir(&id).exists());
}

/// The directory of `pid`'s group for `controller` (v1), or its unified
/// group (v2, mounted at /sys/fs/cgroup).
fn group_dir(pid: i32, controller: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for line in text.lines() {
        let f: Vec<&str> = line.splitn(3, ':').collect();
        if f[1].split(',').any(|c| c == controller) {
            return std::path::Path::new("/sys/fs/cgroup").join(controller).join(f[2].trim_start_matches('/'));
        }
    }
    let v2 = text.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or_else(|| panic!("{text}"));
    std::path::Path::new("/sys/fs/cgroup").join(v2.trim_start_matches('/'))
}

#[test]
fn cpu_pids_and_memory_limits_reach_the_vms_control_groups() {
    let sleeper = OciImage::app("sleeper");
    let o = podman(&["run", "-d", "--cpus", "0.5", "--pids-limit", "64", "-m", "32m", &sleeper.name, "100", "1"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let id = text(&o.stdout).trim().to_string();
    let pid: i32 = text(&podman(&["inspect", &id, "--format", "{{.State.Pid}}"]).stdout).trim().parse().unwrap();
    assert!(
        alive(pid),
        "the VM's process {pid}: {} {}",
        text(&podman(&["inspect", &id, "--format", "{{.State.Status}} {{.State.ExitCode}} {{.State.Error}}"]).stdout),
        text(&podman(&["logs", &id]).stderr)
    );
    let pids = group_dir(pid, "pids");
    assert!(pids.to_str().unwrap().contains(&id), "the VM's process is in the container's group: {}", pids.display());
    let read = |d: &std::path::Path, f: &str| std::fs::read_to_string(d.join(f)).unwrap_or_else(|e| panic!("{}: {e}", d.join(f).display())).trim().to_string();
    let v1 = pids.starts_with("/sys/fs/cgroup/pids");
    if v1 {
        assert_eq!(read(&pids, "pids.max"), "64");
        let cpu = group_dir(pid, "cpu");
        assert_eq!((read(&cpu, "cpu.cfs_quota_us"), read(&cpu, "cpu.cfs_period_us")), ("50000".into(), "100000".into()));
        // The guest's 32 MiB and the monitor's headroom.
        assert_eq!(read(&group_dir(pid, "memory"), "memory.limit_in_bytes"), ((32u64 << 20) + (32 << 20)).to_string());
    } else {
        assert_eq!(read(&pids, "pids.max"), "64");
        assert_eq!(read(&pids, "cpu.max"), "50000 100000");
    }
    // podman's own view of the group.
    let o = podman(&["stats", "--no-stream", "--format", "{{.ID}} {{.MemUsage}}", &id]);
    assert!(o.status.success() && text(&o.stdout).contains(&id[..12]), "{} {}", text(&o.stdout), text(&o.stderr));
    assert!(podman(&["rm", "-f", &id]).status.success());
    assert!(!pids.exists(), "the group is removed with the container");
}

#[test]
fn a_port_published_by_podman_reaches_daytime_in_the_vm() {
    let daytime = OciImage::app("daytime");
    // A network of the test's own, removed at the end.
    let net = format!("wisp-oci-test-{}", std::process::id());
    struct Net(String);
    impl Drop for Net {
        fn drop(&mut self) {
            let _ = std::process::Command::new("podman").args(["network", "rm", "-f", &self.0]).output();
        }
    }
    // podman picks a free subnet; the host port is podman's choice too.
    let o = common::run(std::process::Command::new("podman").args(["network", "create", &net]));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let _net = Net(net.clone());
    let subnet = text(&common::run(std::process::Command::new("podman").args(["network", "inspect", &net, "--format", "{{range .Subnets}}{{.Subnet}}{{end}}"])).stdout);
    let prefix = subnet.trim().rsplit_once('.').map(|(p, _)| format!("{p}.")).unwrap_or_else(|| panic!("subnet {subnet:?}"));
    let o = podman(&["run", "-d", "--network", &net, "-p", "127.0.0.1::13", &daytime.name]);
    let id = text(&o.stdout).trim().to_string();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let mapped = text(&podman(&["port", &id, "13/tcp"]).stdout);
    let port: u16 = mapped.trim().rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("podman port: {mapped:?}"));
    // The VM listens within milliseconds; until then the connection is
    // refused or reset.
    let line = until(Duration::from_secs(10), "a daytime line through the published port", || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        (!out.is_empty()).then_some(out)
    });
    // `Mon Nov 23 08:30:00 2026\r\n`
    let f: Vec<&str> = line.split_whitespace().collect();
    assert!(line.ends_with("\r\n") && f.len() == 5 && f[3].len() == 8 && f[4].len() == 4, "{line:?}");
    let logs = text(&podman(&["logs", &id]).stdout);
    assert!(logs.contains(&format!("daytime: listening on {prefix}")), "the VM has the container's address (in {subnet}): {logs}");
    assert!(podman(&["rm", "-f", &id]).status.success());
}

#[test]
fn images_without_a_good_wisp_image_are_refused_with_what_is_wrong() {
    let none = OciImage::new("none", &[("/etc/motd", b"no image here\n".to_vec())]);
    let o = podman(&["run", "--rm", &none.name]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("no wisp image at /wisp/image"), "{}", text(&o.stderr));
    let junk = OciImage::new("junk", &[("/wisp/image", b"\x7fELF but not really".to_vec())]);
    let o = podman(&["run", "--rm", &junk.name]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("/wisp/image"), "{}", text(&o.stderr));
    // The annotation names another path; a path out of the root
    // filesystem is refused.
    let hello = OciImage::app("hello");
    let o = podman(&["run", "--rm", "--annotation", "org.wisp.image=/../../etc/passwd", &hello.name]);
    assert!(text(&o.stderr).contains("without '..'"), "{}", text(&o.stderr));
}

#[test]
fn the_runtime_cleans_up_after_a_killed_engine() {
    let sleeper = OciImage::app("sleeper");
    let id = text(&podman(&["run", "-d", &sleeper.name, "100", "1"]).stdout).trim().to_string();
    let pids = text(&podman(&["inspect", &id, "--format", "{{.State.ConmonPid}} {{.State.Pid}}"]).stdout);
    let (conmon, vm): (i32, i32) = match pids.split_whitespace().map(|p| p.parse().unwrap()).collect::<Vec<_>>()[..] {
        [c, v] => (c, v),
        _ => panic!("{pids}"),
    };
    // The engine's monitor dies; podman can still stop the VM, but nobody
    // deletes the runtime's state (runc's stays behind the same way).
    // SAFETY: kill takes a pid and a signal number.
    unsafe { libc::kill(conmon, libc::SIGKILL) };
    until(Duration::from_secs(10), "conmon gone", || (!alive(conmon)).then_some(()));
    assert!(alive(vm), "the VM outlives its engine's monitor, as a runc container does");
    assert!(podman(&["rm", "-f", "-t", "0", &id]).status.success());
    until(Duration::from_secs(10), "the VM's process gone", || (!alive(vm)).then_some(()));
    assert!(state_dir(&id).exists(), "nobody deleted the runtime's state (else this test proves nothing)");
    // The runtime's next command marks it orphaned; one after the grace
    // (the mark made older here) removes it.
    let hello = OciImage::app("hello");
    assert!(podman(&["run", "--rm", &hello.name]).status.success());
    let mark = state_dir(&id).join("orphaned");
    assert!(mark.exists(), "marked as orphaned");
    let f = std::fs::File::options().write(true).open(&mark).unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(61)).unwrap();
    assert!(podman(&["run", "--rm", &hello.name]).status.success());
    assert!(!state_dir(&id).exists(), "the state of a container whose process and engine are gone is removed");
}
