//! What a guest is given beside its arguments, end to end with the bundled
//! `wc` app: standard error apart from standard output, environment
//! variables, standard input and read-only files, in this process and
//! through wispd (a VM per process, and grouped), and clear errors for bad
//! ones.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::daemon::Daemon;
use common::{fresh_dir, wisp, wisp_input, Run};

const TEXT: &str = "hello world\nsecond line here\n";

fn text_file(dir: &Path) -> PathBuf {
    let f = dir.join("a.txt");
    std::fs::write(&f, TEXT).unwrap();
    f
}

/// `wisp ARGS` against `socket` (a daemon), with `input` on its stdin.
fn via(socket: &Path, args: &[&str], input: Option<&str>) -> Run {
    wisp_input(args, &[("WISP_SOCKET", socket)], input.map(|s| s.as_bytes().to_vec()), Duration::from_secs(30))
}

/// The same run of `wc`, in this process or through a daemon: counts on
/// stdout, a missing file on stderr only, an environment variable obeyed.
fn files_env_and_stderr(run: &dyn Fn(&[&str], Option<&str>) -> Run, file: &Path) {
    let map = format!("{}:/etc/a.txt", file.display());
    let r = run(&["run", "--file", &map, "wc", "--", "/etc/a.txt", "/etc/nope"], None);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert_eq!(r.stdout, "      2       5      29 /etc/a.txt\n      2       5      29 total\n");
    assert!(r.stderr.contains("wc: /etc/nope: no such file"), "{}", r.stderr);
    assert!(!r.stdout.contains("nope"), "stderr leaked into stdout: {}", r.stdout);
    let r = run(&["run", "-e", "WC_ONLY=words", "--file", &map, "wc", "--", "/etc/a.txt"], None);
    assert_eq!((r.code, r.stdout.as_str()), (Some(0), "      5 /etc/a.txt\n"), "{}", r.stderr);
    // The last of a key wins; an env file comes before -e.
    let env_file = file.with_file_name("wc.env");
    std::fs::write(&env_file, "# counts\nWC_ONLY=bytes\n\n").unwrap();
    let r = run(&["run", "--env-file", env_file.to_str().unwrap(), "--file", &map, "wc", "--", "/etc/a.txt"], None);
    assert_eq!(r.stdout, "     29 /etc/a.txt\n", "{}", r.stderr);
    let r = run(&["run", "--env-file", env_file.to_str().unwrap(), "-e", "WC_ONLY=lines", "--file", &map, "wc", "--", "/etc/a.txt"], None);
    assert_eq!(r.stdout, "      2 /etc/a.txt\n", "{}", r.stderr);
    let r = run(&["run", "-e", "WC_ONLY=bogus", "--file", &map, "wc", "--", "/etc/a.txt"], None);
    assert_eq!(r.code, Some(2));
    assert_eq!((r.stdout.as_str(), r.stderr.trim()), ("", "wc: WC_ONLY must be lines, words or bytes"));
}

/// Standard input: what `-i` reads goes to the guest; without `-i` the
/// guest's input is empty (its reads end at once).
fn stdin(run: &dyn Fn(&[&str], Option<&str>) -> Run) {
    let big: String = (0..3000).map(|i| format!("line {i} of the input\n")).collect();
    let r = run(&["run", "-i", "wc"], Some(&big));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.stdout, format!("   3000   15000 {:>7} \n", big.len()));
    let r = run(&["run", "wc"], Some("ignored\n"));
    assert_eq!(r.stdout, "      0       0       0 \n", "{}", r.stderr);
}

#[test]
fn in_this_process() {
    let dir = fresh_dir("io-direct");
    let file = text_file(&dir);
    let run = |args: &[&str], input: Option<&str>| {
        wisp_input(args, &[] as &[(&str, &str)], input.map(|s| s.as_bytes().to_vec()), Duration::from_secs(30))
    };
    files_env_and_stderr(&run, &file);
    stdin(&run);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn through_wispd() {
    let dir = fresh_dir("io-daemon");
    let file = text_file(&dir);
    let d = Daemon::start("io-daemon", &[]);
    let run = |args: &[&str], input: Option<&str>| via(&d.socket, args, input);
    files_env_and_stderr(&run, &file);
    stdin(&run);
    // Detached: standard error kept apart, while it runs and once it ended.
    let map = format!("{}:/a", file.display());
    let r = via(&d.socket, &["run", "-d", "--name", "counted", "--file", &map, "wc", "--", "/a", "/b"], None);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(via(&d.socket, &["wait", "counted"], None).code, Some(1));
    let out = via(&d.socket, &["logs", "counted"], None);
    assert_eq!(out.stdout, "      2       5      29 /a\n      2       5      29 total\n");
    let err = via(&d.socket, &["logs", "--stderr", "counted"], None);
    assert_eq!(err.stdout, "wc: /b: no such file (give it with wisp run --file HOST:GUEST)\n");
    assert!(d.vm_dir(&r.stdout.trim().to_string()).join("stderr.log").exists());
    // A VM's input is taken once, and only if it was asked for.
    let mut c = d.client();
    let vm = c.create(&wisp_api::CreateVm { image: "wc".into(), stdin: true, ..Default::default() }).unwrap();
    let conn = c.open_stdin(&vm.id).unwrap();
    let again = c.open_stdin(&vm.id);
    assert!(matches!(again, Err(wisp_api::client::ApiError::Status(409, ref m)) if m.contains("taken already")), "{again:?}");
    std::io::Write::write_all(&mut &conn, b"a b c\n").unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(c.wait(&vm.id).unwrap().code, 0);
    assert_eq!(common::console(&mut c, &vm.id), "      1       3       6 \n");
    let late = c.open_stdin(&vm.id);
    assert!(matches!(late, Err(wisp_api::client::ApiError::Status(409, ref m)) if m.contains("exited")), "{late:?}");
    let shut = c.create(&wisp_api::CreateVm { image: "sleeper".into(), ..Default::default() }).unwrap();
    let r = c.open_stdin(&shut.id);
    assert!(matches!(r, Err(wisp_api::client::ApiError::Status(409, ref m)) if m.contains("not open")), "{r:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn in_a_grouped_vmm_process() {
    let dir = fresh_dir("io-group");
    let file = text_file(&dir);
    let d = Daemon::start("io-group", &["--vms-per-process", "4"]);
    let run = |args: &[&str], input: Option<&str>| {
        let mut all = vec!["run", "--tenant", "acme"];
        all.extend_from_slice(&args[1..]);
        via(&d.socket, &all, input)
    };
    files_env_and_stderr(&run, &file);
    stdin(&run);
    let listed = via(&d.socket, &["ps", "-a"], None).stdout;
    assert!(listed.lines().count() > 4, "{listed}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_environment_and_files_are_refused_with_one_line() {
    let dir = fresh_dir("io-bad");
    let r = wisp(&["run", "-e", "=x", "hello"]);
    assert!(r.code == Some(125) && r.stderr.contains("-e =x: an empty key"), "{}", r.stderr);
    let r = wisp(&["run", "-e", "WISP_TEST_SURELY_UNSET", "hello"]);
    assert!(r.stderr.contains("neither KEY=VALUE nor a variable set here"), "{}", r.stderr);
    let r = wisp(&["run", "--file", "a.txt", "hello"]);
    assert!(r.code == Some(2) && r.stderr.contains("expected HOST:GUEST"), "{}", r.stderr);
    let r = wisp(&["run", "--file", "a.txt:etc/a", "hello"]);
    assert!(r.stderr.contains("GUEST an absolute path"), "{}", r.stderr);
    let r = wisp(&["run", "--file", "/dev/zero:/z", "hello"]);
    assert!(r.code == Some(125) && r.stderr.contains("--file /dev/zero: not a regular file"), "{}", r.stderr);
    let r = wisp(&["run", "--file", "/nonexistent/x:/x", "hello"]);
    assert!(r.code == Some(125) && r.stderr.contains("--file /nonexistent/x"), "{}", r.stderr);
    let file = text_file(&dir);
    let twice = format!("{}:/a", file.display());
    let r = wisp(&["run", "--file", &twice, "--file", &twice, "hello"]);
    assert!(r.stderr.contains("guest path '/a' is given twice"), "{}", r.stderr);
    // More files than wispd takes: said before anything is sent.
    let big = dir.join("big");
    std::fs::write(&big, vec![b'x'; 600 * 1024]).unwrap();
    let d = Daemon::start("io-bad", &[]);
    let r = via(&d.socket, &["run", "--file", &format!("{}:/big", big.display()), "hello"], None);
    assert!(r.code == Some(125) && r.stderr.contains("at most 512 KiB of files go through wispd"), "{}", r.stderr);
    // The API refuses what the CLI would not send.
    let mut c = d.client();
    let bad = wisp_api::CreateVm { image: "hello".into(), env: vec!["NOEQ".into()], ..Default::default() };
    let r = c.create(&bad);
    assert!(matches!(r, Err(wisp_api::client::ApiError::Status(400, ref m)) if m.contains("not KEY=VALUE")), "{r:?}");
    let bad = wisp_api::CreateVm { image: "hello".into(), files: vec![wisp_api::GuestFile { path: "/x".into(), data: "%%%".into() }], ..Default::default() };
    let r = c.create(&bad);
    assert!(matches!(r, Err(wisp_api::client::ApiError::Status(400, ref m)) if m.contains("not base64")), "{r:?}");
    assert!(c.list().unwrap().is_empty(), "a refused create left a VM");
    let _ = std::fs::remove_dir_all(&dir);
}
