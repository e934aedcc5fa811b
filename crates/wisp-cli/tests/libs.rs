//! `wisp lib`: a key made, a library signed with it as a version and
//! inspected as the monitor checks it; what is refused on the way. And a
//! guest calling a shared library the monitor mapped (`wisp run --lib`).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

fn wisp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wisp")).args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn a_library_is_signed_with_a_new_key_and_inspected() {
    let dir = common::fresh_dir("libs");
    let bundled = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/libs/hello.so")).expect("make libs");
    // Signed already (by `make libs`): shown, and not signed twice.
    let lib = dir.join("hello.so");
    std::fs::write(&lib, &bundled).unwrap();
    let o = wisp(&["lib", "inspect", lib.to_str().unwrap()]);
    assert!(o.status.success() && text(&o).starts_with("version 1.0.0, signed by ea4a6c63"), "{}", text(&o));
    assert!(text(&o).contains("fn  hello_greet") && text(&o).contains("var hello_calls 0x") && text(&o).contains(" 8\n"), "{}", text(&o));
    let key = dir.join("k");
    let o = wisp(&["lib", "keygen", key.to_str().unwrap()]);
    let public = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(o.status.success() && public.len() == 64, "{}", text(&o));
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    let o = wisp(&["lib", "keygen", key.to_str().unwrap()]);
    assert!(!o.status.success(), "a key made over another");
    let o = wisp(&["lib", "sign", "--key", key.to_str().unwrap(), "--version", "2.0.0", lib.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("signed already"), "{}", text(&o));
    // The ELF alone (the 120-byte trailer cut), signed with the new key.
    std::fs::write(&lib, &bundled[..bundled.len() - 120]).unwrap();
    assert_eq!(text(&wisp(&["lib", "inspect", lib.to_str().unwrap()])).lines().next(), Some("unsigned"));
    let out = dir.join("signed.so");
    let o = wisp(&["lib", "sign", "--key", key.to_str().unwrap(), "--version", "2.0.0", "-o", out.to_str().unwrap(), lib.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = wisp(&["lib", "inspect", out.to_str().unwrap()]);
    assert!(text(&o).starts_with(&format!("version 2.0.0, signed by {public}")), "{}", text(&o));
    // Changed after signing: refused.
    let mut b = std::fs::read(&out).unwrap();
    b[100] ^= 0xff;
    std::fs::write(&out, &b).unwrap();
    let o = wisp(&["lib", "inspect", out.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("does not verify"), "{}", text(&o));
    // A key others can read, a bad version, a file that is no library.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = wisp(&["lib", "sign", "--key", key.to_str().unwrap(), "--version", "2.0.1", lib.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("readable by its owner only"), "{}", text(&o));
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = wisp(&["lib", "sign", "--key", key.to_str().unwrap(), "--version", "2.0", lib.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("MAJOR.MINOR.PATCH"), "{}", text(&o));
    let o = wisp(&["lib", "sign", "--key", key.to_str().unwrap(), "--version", "2.0.1", key.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("not an ELF64 file"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

fn bundled_path() -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/libs/hello.so").display().to_string()
}

fn run_direct(args: &[&str]) -> Output {
    common::direct(&mut Command::new(env!("CARGO_BIN_EXE_wisp"))).args(args).output().unwrap()
}

#[test]
fn a_guest_calls_a_library_the_monitor_mapped() {
    let lib = bundled_path();
    // Bound on the first call, its counter (reached through the library's
    // own relocated GOT entry) read in place.
    let o = run_direct(&["run", "--lib", &lib, "libhello", "--", "5"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    for k in 1..=5 {
        assert!(out.contains(&format!("hello from hello.so (call {k})\n")), "{out}");
    }
    assert!(out.contains("libhello: version 100") && out.contains("libhello: the library counted 5 calls"), "{out}");
    // Not given the library: the first call says which is missing.
    let o = run_direct(&["run", "libhello"]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    assert!(text(&o).contains("no hello_greet in library hello"), "{}", text(&o));
    // A forked child calls it too, from its copy of the library's data
    // (the counter as it was at the fork), and so does the parent after.
    let o = run_direct(&["run", "--lib", &lib, "libhello", "--", "fork"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    for line in ["before the fork: hello from hello.so (call 1)", "child: hello from hello.so (call 2)", "parent: hello from hello.so (call 2)"] {
        assert!(out.contains(line), "{line}: {out}");
    }
    // Its code is read-only for the guest: a write to it stops the VM.
    let o = run_direct(&["run", "--lib", &lib, "libhello", "--", "poke"]);
    assert!(!o.status.success() && text(&o).contains("page fault (#PF): write to 0x1402"), "{}", text(&o));
    assert!(!text(&o).contains("the write went through"), "{}", text(&o));
    // Changed after signing: refused before the VM boots.
    let dir = common::fresh_dir("libs-run");
    let mut b = std::fs::read(&lib).unwrap();
    b[100] ^= 0xff;
    let bad = dir.join("hello.so");
    std::fs::write(&bad, &b).unwrap();
    let o = run_direct(&["run", "--lib", bad.to_str().unwrap(), "libhello"]);
    assert!(!o.status.success() && text(&o).contains("does not verify") && !text(&o).contains("hello from"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn under_wispd_vms_map_one_copy_of_a_library() {
    let d = common::daemon::Daemon::start("libs-daemon", &["--pool", "16M=2"]);
    let lib = bundled_path();
    let o = d.wisp(&["run", "--lib", &lib, "libhello", "--", "2"]);
    assert!(o.status.success() && text(&o).contains("hello from hello.so (call 2)") && text(&o).contains("counted 2 calls"), "{}", text(&o));
    // Three VMs of it: each its own counter, one copy of the library
    // (the daemon's sealed memfd) mapped by every VMM process.
    let mut c = d.client();
    let ids: Vec<String> = (0..3)
        .map(|_| {
            let o = d.wisp(&["run", "-d", "--lib", &lib, "libhello", "--", "1", "wait"]);
            assert!(o.status.success(), "{}", text(&o));
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        })
        .collect();
    let mut inodes = std::collections::HashSet::new();
    for id in &ids {
        common::wait_console(&mut c, id, "libhello: the library counted 1 calls");
        let pid = c.get(id).unwrap().pid;
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        inodes.extend(maps.lines().filter(|l| l.contains("/memfd:wisp-library")).filter_map(|l| l.split_whitespace().nth(4).map(str::to_string)));
    }
    assert_eq!(inodes.len(), 1, "one copy of the library for every VM: {inodes:?}");
    // A path that is no library, or relative: refused before anything runs.
    let o = d.wisp(&["run", "--lib", "/etc/hostname.so", "libhello"]);
    assert!(!o.status.success() && text(&o).contains("library /etc/hostname.so"), "{}", text(&o));
    assert!(d.wisp(&["rm", "-f", "--all"]).status.success());
}

fn built(name: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/libs").join(name).display().to_string()
}

#[test]
fn a_library_is_replaced_in_a_running_vm_with_its_state() {
    let d = common::daemon::Daemon::start("libs-update", &["--pool", "16M=2"]);
    let (lib, lib2) = (bundled_path(), built("hello2.so"));
    let mut c = d.client();
    let o = d.wisp(&["run", "-d", "--name", "watcher", "--lib", &lib, "libhello", "--", "3", "watch"]);
    assert!(o.status.success(), "{}", text(&o));
    common::wait_console(&mut c, "watcher", "libhello: watching version 100");
    // Binary-incompatible (no hello_greet, hello_calls...): refused before
    // anything changes; so is a library the VM does not map.
    let dir = common::fresh_dir("libs-update");
    let other = dir.join("other.so");
    std::fs::copy(built("hello.so"), &other).unwrap();
    let o = d.wisp(&["update", "watcher", other.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("the VM maps no library named other (it maps: hello)"), "{}", text(&o));
    let o = d.wisp(&["update", "--replace", "hello", "watcher", &built("bench.so")]);
    assert!(!o.status.success() && text(&o).contains("not binary-compatible with the library it replaces: the new library has no hello_"), "{}", text(&o));
    // The image's policy takes version 1.0.0 or newer: an older one is
    // refused before it is mapped (signed with the test key, so wispd
    // takes the file; the VMM process checks the policy).
    let old = dir.join("hello-old.so");
    let b = std::fs::read(&lib).unwrap();
    std::fs::write(dir.join("hello.unsigned"), &b[..b.len() - 120]).unwrap();
    let key = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest/libs/test.key");
    let o = wisp(&["lib", "sign", "--key", key.to_str().unwrap(), "--version", "0.9.0", "--out", old.to_str().unwrap(), dir.join("hello.unsigned").to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = d.wisp(&["update", "--replace", "hello", "watcher", old.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("version 0.9.0 is older than the 1.0.0 the image takes"), "{}", text(&o));
    // A paused VM reaches no quiescent point: refused at once.
    assert!(d.wisp(&["pause", "watcher"]).status.success());
    let o = d.wisp(&["update", "--replace", "hello", "watcher", &lib2]);
    assert!(!o.status.success() && text(&o).contains("the VM is paused"), "{}", text(&o));
    assert!(d.wisp(&["resume", "watcher"]).status.success());
    // Still the old library, running.
    let logs = || text(&d.wisp(&["logs", "watcher"]));
    assert!(!logs().contains("now version"), "{}", logs());
    // The update: the counter carried over, its pointer moved, the guest
    // held briefly, and the new code answering.
    let o = d.wisp(&["update", "--replace", "hello", "watcher", &lib2]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("library hello is now") && text(&o).contains("2 variables carried over, 1 pointers moved"), "{}", text(&o));
    let exit = c.wait("watcher").unwrap();
    assert_eq!(exit.code, 0, "{exit:?}");
    let log = logs();
    let line = log.lines().find(|l| l.starts_with("libhello: now version 200 after ")).unwrap_or_else(|| panic!("{log}"));
    let calls: u64 = line["libhello: now version 200 after ".len()..].split(' ').next().unwrap().parse().unwrap();
    assert!(line.contains(&format!("the library counted {calls};")) && line.contains("its pointer follows the counter"), "{log}");
    assert!(log.contains(&format!("hello from hello.so v2 (call {calls})")), "{log}");
    // The old library's memory is gone from the VMM process: one library
    // mapping left (the pid is the VM's, gone now: checked by the counts).
    assert!(d.wisp(&["rm", "-f", "--all"]).status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_image_takes_only_the_libraries_its_policy_names() {
    // libhello's policy: signed with the repository's test key, 1.0.0 or
    // newer, only the library it names (`wisp inspect` shows it).
    let o = wisp(&["inspect", "libhello"]);
    assert!(text(&o).contains("libraries: signed by ea4a6c63e29c520a…; version 1.0.0 or newer; from: named, update"), "{}", text(&o));
    let dir = common::fresh_dir("libs-policy");
    let b = std::fs::read(bundled_path()).unwrap();
    let unsigned = dir.join("hello.so");
    std::fs::write(&unsigned, &b[..b.len() - 120]).unwrap();
    let sign = |key: &std::path::Path, version: &str, out: &str| {
        let out = dir.join(out).join("hello.so");
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let o = wisp(&["lib", "sign", "--key", key.to_str().unwrap(), "--version", version, "--out", out.to_str().unwrap(), unsigned.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
        out.display().to_string()
    };
    let test_key = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest/libs/test.key");
    let other_key = dir.join("other.key");
    assert!(wisp(&["lib", "keygen", other_key.to_str().unwrap()]).status.success());
    let cases = [
        (unsigned.display().to_string(), "it is not signed, and the image takes signed libraries only"),
        (sign(&other_key, "1.0.0", "other"), "which the image does not trust"),
        (sign(&test_key, "0.9.0", "old"), "version 0.9.0 is older than the 1.0.0 the image takes"),
        (built("bench.so"), "the image takes only the libraries it names (hello), not bench"),
    ];
    for (lib, why) in &cases {
        let o = run_direct(&["run", "--lib", lib, "libhello", "--", "1"]);
        assert!(!o.status.success() && text(&o).contains(why), "{lib}: {}", text(&o));
        assert!(!text(&o).contains("hello from"), "{lib}: ran: {}", text(&o));
    }
    // What it takes: the same bytes signed 1.0.0 with the test key.
    let o = run_direct(&["run", "--lib", &sign(&test_key, "1.0.0", "good"), "libhello", "--", "1"]);
    assert!(o.status.success() && text(&o).contains("hello from hello.so (call 1)"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The second line of `hello`'s output, without its figures.
fn booted_line_shape(line: &str) -> bool {
    let Some(rest) = line.strip_prefix("booted ") else { return false };
    let Some((ms, rest)) = rest.split_once(" ms ago, 16 MiB RAM, wall clock ") else { return false };
    ms.split_once('.').is_some_and(|(a, b)| a.parse::<u64>().is_ok() && b.len() == 3) && rest.len() == 20 && rest.ends_with('Z')
}

#[test]
fn an_application_library_runs_as_its_image_would() {
    // `hello` the image, and hello.so's entry loaded by the recycler: the
    // same lines.
    let image = run_direct(&["run", "hello", "--", "a", "b"]);
    let recycled = run_direct(&["run", "--recycle", &bundled_path(), "--", "a", "b"]);
    assert!(image.status.success() && recycled.status.success(), "{}\n{}", text(&image), text(&recycled));
    let (image, recycled) = (String::from_utf8_lossy(&image.stdout).to_string(), String::from_utf8_lossy(&recycled.stdout).to_string());
    let (a, b): (Vec<&str>, Vec<&str>) = (image.lines().collect(), recycled.lines().collect());
    assert_eq!((a.len(), b.len()), (2, 2), "{image}\n{recycled}");
    assert_eq!(a[0], "Hello from wisp! args: [\"a\", \"b\"]");
    assert_eq!(b[0], a[0]);
    assert!(booted_line_shape(a[1]) && booted_line_shape(b[1]), "{image}\n{recycled}");
    // A library with no entry is no application; an image with --recycle
    // is refused.
    let o = run_direct(&["run", "--recycle", &built("bench.so")]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    assert!(text(&o).contains("recycler: library bench has no wisp_app_main: not an application"), "{}", text(&o));
    let o = run_direct(&["run", "--recycle", &bundled_path(), "hello"]);
    assert!(!o.status.success() && text(&o).contains("--recycle runs an application library: give no IMAGE"), "{}", text(&o));
    // Through wispd too.
    let d = common::daemon::Daemon::start("libs-recycle", &["--pool", "16M=2"]);
    let o = d.wisp(&["run", "--recycle", &bundled_path(), "--", "x"]);
    assert!(o.status.success() && text(&o).starts_with("Hello from wisp! args: [\"x\"]\n"), "{}", text(&o));
}

#[test]
fn recycled_runs_go_on_from_a_kept_ready_point_scrubbed_each_time() {
    // wispd keeps each recycler at its ready point between runs; hello.so
    // and the recycler exit 3 if they find the state of an earlier run
    // (their counters), so every run's success says the scrub happened.
    let d = common::daemon::Daemon::start("libs-recycled", &["--pool", "16M=1", "--recyclers-per-process", "2"]);
    let (hello, hello2) = (bundled_path(), built("hello2.so"));
    let run = |lib: &str, arg: &str| {
        let o = d.wisp(&["run", "--recycle", lib, "--", "run", arg]);
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(out.starts_with(&format!("Hello from wisp! args: [\"run\", \"{arg}\"]\n")), "{out}");
        assert!(out.lines().nth(1).is_some_and(booted_line_shape), "{out}");
    };
    for i in 1..=4 {
        run(&hello, &i.to_string());
    }
    // Another library: a recycler of its own; then hello.so's is still kept.
    run(&hello2, "5");
    run(&hello, "6");
    // A library with no entry: the recycler's own exit, after which it is
    // scrubbed and kept like any other.
    let o = d.wisp(&["run", "--recycle", &built("bench.so")]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    let o = d.wisp(&["run", "--recycle", &built("bench.so")]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    let mut c = d.client();
    let mut vms = c.list().unwrap();
    vms.sort_by_key(|v| v.created_ms);
    assert_eq!(vms.len(), 8, "{vms:?}");
    // Each run is a VM of its own (its id, record and exit), all of one
    // recycling group; the runs after a library's first went on from the
    // ready point kept (`preloaded` in the boot trace: nothing loaded).
    let kept: Vec<bool> = vms.iter().map(|v| v.boot_trace.as_ref().is_some_and(|t| t.preloaded)).collect();
    assert_eq!(kept, [false, true, true, true, false, true, false, true], "{vms:?}");
    assert!(vms.iter().all(|v| v.group.is_some() && v.group == vms[0].group && v.image == "recycler"), "{vms:?}");
    assert!(vms.iter().take(6).all(|v| v.exit.as_ref().is_some_and(|e| e.code == 0)), "{vms:?}");
    // What a recycled VM does not have is refused before anything runs.
    let o = d.wisp(&["run", "--recycle", &hello, "--lib", &hello2, "--", "x"]);
    assert!(!o.status.success() && text(&o).contains("recycle: exactly one library"), "{}", text(&o));
    let o = d.wisp(&["run", "--recycle", &hello, "--net", "--", "x"]);
    assert!(!o.status.success() && text(&o).contains("recycle: no NIC"), "{}", text(&o));
    assert!(d.wisp(&["rm", "-f", "--all"]).status.success());
}

/// One raw request to a recycler endpoint: the whole response.
fn endpoint_request(socket: &str, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut c = std::os::unix::net::UnixStream::connect(socket).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    c.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    String::from_utf8_lossy(&out).to_string()
}

fn post(body: &str) -> Vec<u8> {
    format!("POST /v1/vms?attach=true HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

#[test]
fn a_recycler_endpoint_answers_runs_itself() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let d = common::daemon::Daemon::start("libs-endpoint", &["--pool", "16M=1"]);
    let hello = bundled_path();
    let o = d.wisp(&["recycler", "add", &hello]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let (id, socket) = out.trim().split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).unwrap();
    // The socket is its adder's alone.
    let m = std::fs::metadata(&socket).unwrap();
    assert_eq!((m.permissions().mode() & 0o777, m.uid()), (0o600, unsafe { libc::geteuid() }));
    // `wisp run --recycle` of that library goes to it: the endpoint's VMM
    // process answers, and no VM of the toolstack is made for the run.
    for i in 1..=3 {
        let o = d.wisp(&["run", "--recycle", &hello, "--", "run", &i.to_string()]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(String::from_utf8_lossy(&o.stdout).starts_with(&format!("Hello from wisp! args: [\"run\", \"{i}\"]\n")), "{}", text(&o));
    }
    let mut c = d.client();
    assert!(c.list().unwrap().is_empty(), "{:?}", c.list());
    // The wire: the console as chunks, the exit status as a trailer.
    let r = endpoint_request(&socket, &post(r#"{"image":"recycler","args":["w"],"libs":["/any/where/hello.so"],"recycle":true}"#));
    assert!(r.starts_with("HTTP/1.1 201") && r.contains("Hello from wisp! args: [\"w\"]") && r.contains("\r\n0\r\nX-Wisp-Exit: 0\r\n"), "{r}");
    // Bad requests get a 4xx, and the endpoint serves on.
    let r = endpoint_request(&socket, b"GARBAGE\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    let r = endpoint_request(&socket, &post(r#"{"image":"hello"}"#));
    assert!(r.starts_with("HTTP/1.1 400") && r.contains("this endpoint runs hello on the recycler image"), "{r}");
    let r = endpoint_request(&socket, &post(r#"{"libs":["/l/hello2.so"]}"#));
    assert!(r.starts_with("HTTP/1.1 400") && r.contains("this endpoint runs hello.so only"), "{r}");
    let r = endpoint_request(&socket, &post(r#"{"args":["a"],"mem":5}"#));
    assert!(r.starts_with("HTTP/1.1 400") && r.contains("unknown field"), "{r}");
    let r = endpoint_request(&socket, b"GET /v1/vms HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 405"), "{r}");
    let r = endpoint_request(&socket, &post(r#"{"args":["after"]}"#));
    assert!(r.contains("Hello from wisp! args: [\"after\"]") && r.contains("X-Wisp-Exit: 0"), "{r}");
    // A run the monitor stops (here its time limit, already past) ends its
    // recycler; the next run has a new one.
    let r = endpoint_request(&socket, &post(r#"{"args":["late"],"timeout_ms":0}"#));
    assert!(r.starts_with("HTTP/1.1 201") && r.contains("X-Wisp-Exit: 124") && !r.contains("Hello"), "{r}");
    let r = endpoint_request(&socket, &post(r#"{"args":["anew"]}"#));
    assert!(r.contains("Hello from wisp! args: [\"anew\"]") && r.contains("X-Wisp-Exit: 0"), "{r}");
    // A library with no entry: its run's status comes back as any other.
    let o = d.wisp(&["recycler", "add", &built("bench.so")]);
    assert!(o.status.success(), "{}", text(&o));
    let o = d.wisp(&["run", "--recycle", &built("bench.so")]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    assert!(text(&o).contains("recycler: library bench has no wisp_app_main"), "{}", text(&o));
    assert!(c.list().unwrap().is_empty(), "{:?}", c.list());
    assert_eq!(c.recyclers().unwrap().len(), 2);
    // What cannot be an endpoint is refused; removal ends it.
    let o = d.wisp(&["recycler", "add", "/etc/hostname"]);
    assert!(!o.status.success() && text(&o).contains("not an absolute path of a .so file"), "{}", text(&o));
    let dir = common::fresh_dir("libs-endpoint");
    let mut b = std::fs::read(&hello).unwrap();
    b[100] ^= 0xff;
    let bad = dir.join("hello.so");
    std::fs::write(&bad, &b).unwrap();
    let o = d.wisp(&["recycler", "add", bad.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("does not verify"), "{}", text(&o));
    assert!(d.wisp(&["recycler", "rm", &id]).status.success());
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_err(), "the endpoint's socket is gone");
    let o = d.wisp(&["recycler", "rm", &id]);
    assert!(!o.status.success() && text(&o).contains("no such recycler endpoint"), "{}", text(&o));
    // Without its endpoint, the run goes through wispd as before.
    let o = d.wisp(&["run", "--recycle", &hello, "--", "again"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).starts_with("Hello from wisp! args: [\"again\"]"), "{}", text(&o));
    assert_eq!(c.list().unwrap().len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn recycled_runs_that_come_at_once_share_one_recycling_group() {
    // Six first runs at once: one recycling group is made, and the creates
    // that find none open meanwhile wait for it rather than make their own.
    let d = common::daemon::Daemon::start("libs-recycle-burst", &["--pool", "16M=1"]);
    let hello = bundled_path();
    let runs: Vec<std::thread::JoinHandle<Output>> = (0..6)
        .map(|i| {
            let (socket, hello) = (d.socket.clone(), hello.clone());
            std::thread::spawn(move || {
                std::process::Command::new(env!("CARGO_BIN_EXE_wisp"))
                    .args(["run", "--recycle", &hello, "--", &format!("b{i}")])
                    .env("WISP_SOCKET", socket)
                    .stdin(std::process::Stdio::null())
                    .output()
                    .unwrap()
            })
        })
        .collect();
    for (i, r) in runs.into_iter().enumerate() {
        let o = r.join().unwrap();
        assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).starts_with(&format!("Hello from wisp! args: [\"b{i}\"]")), "{}", text(&o));
    }
    let vms = d.client().list().unwrap();
    let groups: std::collections::HashSet<_> = vms.iter().map(|v| v.group.clone()).collect();
    assert_eq!((vms.len(), groups.len()), (6, 1), "{vms:?}");
    assert!(d.wisp(&["rm", "-f", "--all"]).status.success());
}
