//! What `/proc` says of a process, read as the daemon needs it (a leaf:
//! no other module of the daemon here).

use std::fs;

/// The start time of process `pid` (clock ticks after boot), if it lives.
pub fn proc_start(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 22 overall; the state (field 3) is the first after the name.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Process `pid`'s (host) pid in its own PID namespace: the last field of
/// `NSpid:` in its status.
pub fn ns_pid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// The real, effective, saved and file-system ids of a `Uid:` or `Gid:`
/// line of `/proc/<pid>/status`.
pub fn status_ids(status: &str, key: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix(key))?;
    line.split_whitespace().map(|n| n.parse().ok()).collect()
}

/// A VM id: 12 lowercase hex digits (what the daemon makes).
pub fn valid_id(s: &str) -> bool {
    s.len() == 12 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// For tests: run `argv` under `setpriv` with `ids` (its options), stdin
/// piped (the program ends when it closes), and return once `/proc` shows
/// it as `ready` says (given its command line and status), within 5 s.
#[cfg(test)]
pub fn spawn_as(ids: &[&str], argv: &[&str], ready: impl Fn(&[u8], &str) -> bool) -> std::process::Child {
    use std::process::{Command, Stdio};
    let c = Command::new("setpriv")
        .args(ids)
        .args(argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("setpriv (util-linux)");
    let (pid, t) = (c.id(), std::time::Instant::now());
    loop {
        let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if ready(&cmd, &status) {
            return c;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "{argv:?} did not start under {ids:?}");
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_start_time_and_a_pid_in_its_namespace() {
        let me = std::process::id();
        assert!(proc_start(me).is_some());
        assert!(ns_pid(me).is_some());
        assert_eq!(proc_start(u32::MAX), None);
        assert!(valid_id("0123456789ab") && !valid_id("0123456789AB") && !valid_id("0123"));
    }
}
