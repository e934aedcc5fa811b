//! Fork and family IPC on real KVM, in direct mode (`wisp run` with no
//! daemon): the `family` guest exercises each primitive between parent and
//! child, siblings and grandchildren, and reports what it saw.

mod common;

use std::time::Duration;

use common::{eventually, wisp_limit, Run};

fn family(args: &[&str]) -> Run {
    family_limited(64, args)
}

fn family_limited(limit: u32, args: &[&str]) -> Run {
    let limit = limit.to_string();
    let mut a = vec!["run", "--timeout", "30s", "--family-limit", &limit, "family", "--"];
    a.extend(args);
    wisp_limit(&a, Duration::from_secs(60))
}

fn assert_ok(r: &Run, lines: &[&str]) {
    assert_eq!(r.code, Some(0), "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    for l in lines {
        assert!(r.stdout.lines().any(|x| x == *l), "missing line {l:?} in:\n{}", r.stdout);
    }
}

#[test]
fn fork_gives_the_child_a_copy_on_write_copy() {
    let r = family(&["cow"]);
    assert_ok(
        &r,
        &[
            "parent: fork returned a pid true",
            // Written by the parent after the fork: invisible to the child.
            "child: fork returned 0, ppid ok true, sees global 1",
            // Written by the child: invisible to the parent.
            "parent: sees global 2",
            "parent: child exited 7",
            "cow ok",
        ],
    );
}

#[test]
fn forks_handed_to_a_prepared_spare_copy_memory_as_at_the_fork() {
    // After the first fork the parent waits, and a spare monitor process is
    // prepared then; each later fork hands the guest to one, copying the
    // pages that hold anything. The children must see the parent's memory
    // (a global and a 256 KiB heap buffer) as at their own fork, and
    // neither side the other's later writes.
    let r = wisp_limit(&["run", "--stats", "--timeout", "30s", "family", "--", "cow-again", "4"], Duration::from_secs(60));
    let rounds: Vec<String> =
        (1..=4).map(|n| format!("round {n}: child exited 7, parent sees global {} heap 0xdd", n * 10 + 1)).collect();
    let mut lines: Vec<&str> = rounds.iter().map(String::as_str).collect();
    lines.push("cow-again ok");
    assert_ok(&r, &lines);
    // The root's stats count the forks that went to a spare.
    let prepared = root_stat(&r.stderr, "forks_prepared");
    assert_eq!(prepared, Some(3), "the forks after the first should go to a spare:\n{}", r.stderr);
    // Each child's guest ends before the next fork, so its process comes
    // back as a spare (zero RAM again, its writes gone): the children above
    // saw the parent's memory through recycled spares too.
    let recycled = root_stat(&r.stderr, "forks_recycled");
    assert!(recycled.is_some_and(|n| n >= 1), "later forks should reuse an ended child's process:\n{}", r.stderr);
}

/// The one child process of `wisp run` process `root` that is a VM (a
/// spare prepared for the next fork is named `wisp-spare`, not `wisp`).
fn only_child_vm(root: u32) -> u32 {
    let o = std::process::Command::new("pgrep").args(["-P", &root.to_string(), "-x", "wisp"]).output().unwrap();
    let kids = String::from_utf8_lossy(&o.stdout).into_owned();
    match kids.split_whitespace().collect::<Vec<_>>()[..] {
        [one] => one.parse().unwrap(),
        _ => panic!("the root's monitor should have one child process: {kids:?}"),
    }
}

/// Field `key` of the root's `wisp-stats` line (the one with the most
/// exits: its children print theirs too).
fn root_stat(stderr: &str, key: &str) -> Option<u64> {
    let field = |j: &str, k: &str| j.split(&format!("\"{k}\":")).nth(1)?.split(',').next()?.parse::<u64>().ok();
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("wisp-stats: "))
        .filter_map(|j| Some((field(j, "exits")?, field(j, key)?)))
        .max()
        .map(|(_, v)| v)
}

#[test]
fn children_fork_too() {
    let r = family(&["tree"]);
    assert_ok(&r, &["grandchild: parent is the child true", "child: grandchild exited 3", "root: child exited 5"]);
}

#[test]
fn many_children_are_waited_for() {
    let r = family(&["many", "12"]);
    assert_ok(&r, &["many: 12 children, exit codes sum 186 (want 186)", "many ok"]);
}

#[test]
fn pipes_carry_data_eof_and_epipe() {
    let r = family(&["pipe", "200"]);
    assert_ok(&r, &["pipe: child read 204800 bytes, checksum match true", "pipe ok"]);
}

/// The fast path: four children write records (up to PIPE_BUF, so atomic)
/// into one pipe and messages into one queue at once, through the rings on
/// the family's shared page, blocking when the ring is full; every record
/// arrives whole and in its writer's order.
#[test]
fn concurrent_writers_keep_records_whole_through_the_shared_rings() {
    let r = family(&["writers", "4", "400"]);
    assert_ok(&r, &["writers: 4 writers, 400 records each: the pipe and the queue delivered all of them whole and in order"]);
}

/// A member that writes over a pipe's and a queue's ring on the shared page
/// (and leaves a lock held when it ends) loses only its own calls (EIO);
/// its monitor and the others' stay up, and the family's pipes and queue
/// work on, other data intact.
#[test]
fn a_member_that_corrupts_a_ring_loses_only_its_own_call() {
    let r = family(&["corrupt"]);
    assert_ok(&r, &["corrupt: the corrupting member's own calls failed with EIO", "corrupt: the family's pipes and queue work on"]);
}

#[test]
fn siblings_talk_through_pipe_queue_and_shared_memory() {
    let r = family(&["siblings"]);
    assert_ok(
        &r,
        &[
            "sibling B: pipe \"hello sibling\", lowest type first true, shm \"hello through shared memory\"",
            "siblings ok",
        ],
    );
}

#[test]
fn signals_handlers_defaults_kill_and_sigchld() {
    let r = family(&["signals"]);
    assert_ok(
        &r,
        &[
            "child: SIGUSR1 handler ran true, then read 1 byte",
            "parent: SIGTERM child exited 143",
            "parent: SIGKILLed child ended by signal Some(9)",
            "parent: SIGCHLD received true",
            "signals ok",
        ],
    );
}

#[test]
fn message_queues_follow_system_v_rules() {
    let r = family(&["msgq"]);
    assert_ok(&r, &["child: blocked receive ended with Err(\"EIDRM\")", "msgq ok"]);
}

#[test]
fn shared_memory_is_shared_and_detach_takes_it_away() {
    let r = family(&["shm"]);
    assert_ok(&r, &["shm: counter 40000 (want 40000), child's word 0xfeed", "shm ok"]);
    let r = family(&["shm-after-detach"]);
    assert_eq!(r.code, Some(139), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("outside guest RAM"), "{}", r.stderr);
    assert!(!r.stdout.contains("FAILED"), "{}", r.stdout);
}

#[test]
fn a_crashing_child_is_reported_to_its_parent() {
    let r = family(&["crash"]);
    assert_ok(
        &r,
        &[
            "parent: crashed child true ended by signal Some(11)",
            "parent: SIGCHLD true",
            "parent: still fine, global 1",
            "crash ok",
        ],
    );
    assert!(r.stderr.contains("null pointer dereference"), "{}", r.stderr);
}

#[test]
fn the_family_limit_stops_a_fork_bomb() {
    use std::os::unix::process::CommandExt;
    // Every VMM process of the family carries the root's command line; a
    // tag (which the bomb ignores) tells this run's from anyone else's.
    let tag = format!("tag-{}", std::process::id());
    let pattern = format!("family -- bomb {tag}");
    let left = || {
        let o = std::process::Command::new("pgrep").args(["-f", &pattern]).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    // The check sees such a process while one runs (a decoy, so that an
    // empty answer below means something).
    let mut decoy = std::process::Command::new("sleep").arg0(&pattern).arg("60").spawn().unwrap();
    eventually(Duration::from_secs(10), || "pgrep does not see the decoy".into(), || (!left().is_empty()).then_some(()));
    decoy.kill().unwrap();
    decoy.wait().unwrap();

    let r = family_limited(6, &["bomb", &tag]);
    assert_ok(&r, &["bomb ok"]);
    assert!(r.stdout.contains("bomb: fork failed with EAGAIN"), "{}", r.stdout);
    // Nothing of the family is left running once the root has exited (its
    // members' processes end on their own, soon after).
    eventually(Duration::from_secs(10), || format!("left over: {}", left()), || left().is_empty().then_some(()));
}

#[test]
fn pids_are_family_local_and_host_pids_name_nothing() {
    // The guest gets the pid of a live host process (this test's) and must
    // not be able to tell it from a pid that exists nowhere.
    let me = std::process::id();
    assert!(me > 1);
    let r = family(&["pids", &me.to_string()]);
    assert_ok(
        &r,
        &[
            "pids: root 1 parent 0",
            "pids: grandchild 3 parent 2",
            "pids: child 2 parent 1 forked 3 which exited 0",
            "pids: fork returned 2, wait returned 2 with exit Some(0)",
            "pids: the next fork returned 4",
            &format!("pids: kill of host pid {me}: Err(\"ESRCH\"), Err(\"ESRCH\"); waitpid Err(\"ECHILD\")"),
            "pids ok",
        ],
    );
}

#[test]
fn another_family_is_refused() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    // Family A holds a queue under a key; family B knows the host pid of
    // A's VM (its monitor: the `wisp run` process) and the key.
    let mut a = common::direct(Command::new(env!("CARGO_BIN_EXE_wisp")).args([
        "run",
        "--timeout",
        "30s",
        "family",
        "--",
        "hold",
        "5151",
    ]))
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(a.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "hold: pid 1 key 5151");
    let r = family(&["cross", &a.id().to_string(), "5151"]);
    let _ = a.kill();
    let _ = a.wait();
    assert_ok(&r, &["cross: kill Err(\"ESRCH\"), waitpid Err(\"ECHILD\"), msgget Err(\"ENOENT\")", "cross ok"]);
}

#[test]
fn a_family_of_one_cannot_fork() {
    let r = family_limited(1, &["many", "1"]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert!(r.stdout.contains("FAILED: fork 0: EAGAIN"), "{}", r.stdout);
}

#[test]
fn a_child_killed_from_outside_is_reaped_and_reported() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};
    let mut root = common::direct(Command::new(env!("CARGO_BIN_EXE_wisp")).args([
        "run", "--timeout", "30s", "family", "--", "victim",
    ]))
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut out = BufReader::new(root.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "victim: child pid 2");
    // The child VM's monitor is a process of its own, the only child
    // process of the root's (the `wisp run` process) that is a VM — a
    // spare prepared for the next fork is named `wisp-spare`: kill it like
    // any.
    let pid = only_child_vm(root.id());
    assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = root.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{rest}");
    assert!(rest.contains("victim: parent saw the child end by signal Some(9)"), "{rest}");
}

#[test]
fn a_forked_child_drops_its_parents_descriptors() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};
    // The root forks (its spare for later forks holds a memfd, its reaper
    // a pidfd and an eventfd) and is started with one more descriptor of
    // its own, as from a shell: none of them is the child's.
    let extra = std::fs::File::open("/dev/zero").unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wisp"));
    cmd.args(["run", "--timeout", "30s", "family", "--", "victim"]);
    let extra_fd = std::os::fd::AsRawFd::as_raw_fd(&extra);
    // SAFETY: between fork and exec only clears close-on-exec on a
    // descriptor of ours (fcntl is async-signal-safe).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if libc::fcntl(extra_fd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut root = common::direct(&mut cmd).stdout(Stdio::piped()).spawn().unwrap();
    drop(extra);
    let mut out = BufReader::new(root.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "victim: child pid 2");
    let pid = only_child_vm(root.id());
    let theirs = common::fds(root.id());
    assert!(theirs.iter().any(|(_, t)| t == "/dev/zero"), "{theirs:?}");
    // Standard output and error stay (the family's console).
    let mine = common::fds(pid);
    for n in [1, 2] {
        assert_eq!(mine.iter().find(|f| f.0 == n), theirs.iter().find(|f| f.0 == n), "{mine:?}");
    }
    common::assert_only_own_fds(pid, &[]);
    // It still works: its parent sees it end when it is killed.
    assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert_eq!(root.wait().unwrap().code(), Some(0), "{rest}");
    assert!(rest.contains("victim: parent saw the child end by signal Some(9)"), "{rest}");
}

#[test]
fn blocked_vms_use_no_cpu() {
    // A parent blocked in read, then wait, for a second while its child
    // sleeps: both VMs are parked.
    let r = family(&["idle-wait"]);
    assert_ok(&r, &["idle-wait ok"]);
    assert!(r.wall >= Duration::from_secs(1), "{:?}", r.wall);
    assert!(r.cpu < Duration::from_millis(300), "used {:?} of CPU in {:?}", r.cpu, r.wall);
}

#[test]
fn a_dead_orphan_leaves_the_family() {
    // Nobody reaps the grandchild, yet its pipe end is released.
    let r = family(&["orphan-eof"]);
    assert_ok(&r, &["orphan-eof: read returned 0", "orphan-eof ok"]);
}
