//! What `/proc` says of a process, read as the daemon needs it (a leaf:
//! no other module of the daemon here).

use std::fs;

/// The start time of process `pid` (clock ticks after boot), if it lives.
pub fn proc_start(pid: u32) -> Option<u64> {
    usage(pid).map(|u| u.start)
}

/// What a process has used, from one read of `/proc/<pid>/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// User and system CPU time (`utime` + `stime`), in clock ticks.
    pub cpu_ticks: u64,
    /// Resident pages (`rss`: the kernel's anonymous, file and shared
    /// memory page counts, the same as `VmRSS` in its status).
    pub rss_pages: u64,
    /// Start time (clock ticks after boot), to tell it from a process
    /// that took its pid since.
    pub start: u64,
}

/// Process `pid`'s CPU time and resident memory, if it lives.
pub fn usage(pid: u32) -> Option<Usage> {
    parse_usage(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// [`usage`] of the text of a `stat` file.
fn parse_usage(stat: &str) -> Option<Usage> {
    // Fields after the command name (which may hold spaces and
    // parentheses): the state (field 3) first, so field N is at N - 3.
    let f: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let n = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some(Usage { cpu_ticks: n(14)? + n(15)?, rss_pages: n(24)?, start: n(22)? })
}

/// Clock ticks per second (`USER_HZ`: what `/proc` counts CPU time in).
pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a constant of the system.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// Bytes in a page (what `/proc` counts resident memory in).
pub fn page_size() -> u64 {
    // SAFETY: sysconf only reads a constant of the system.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as u64 } else { 4096 }
}

/// One network interface's counters, as the host counts them (for a tap:
/// received = what the VM sent, transmitted = what went to the VM).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetDev {
    pub rx_bytes: u64,
    pub rx_packets: u64,
    /// Received frames dropped (`rx_dropped` + `rx_missed_errors`).
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_dropped: u64,
}

/// The counters of every interface of the daemon's network namespace, by
/// name: `/proc/self/net/dev`, one read for all (where
/// `/sys/class/net/<tap>/statistics/` is four files a tap, and shows the
/// namespace sysfs was mounted in, not necessarily the daemon's).
pub fn net_devs() -> std::collections::HashMap<String, NetDev> {
    parse_net_dev(&fs::read_to_string("/proc/self/net/dev").unwrap_or_default())
}

/// [`net_devs`] of the text of a `net/dev` file (two header lines, then
/// `name: ` and 16 counters: 8 received, 8 transmitted).
fn parse_net_dev(text: &str) -> std::collections::HashMap<String, NetDev> {
    let mut out = std::collections::HashMap::new();
    for line in text.lines() {
        let Some((name, rest)) = line.split_once(':') else { continue };
        let n: Vec<u64> = rest.split_whitespace().map_while(|x| x.parse().ok()).collect();
        if n.len() < 16 {
            continue;
        }
        let d = NetDev { rx_bytes: n[0], rx_packets: n[1], rx_dropped: n[3], tx_bytes: n[8], tx_packets: n[9], tx_dropped: n[11] };
        out.insert(name.trim().to_string(), d);
    }
    out
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

    #[test]
    fn usage_is_read_from_stat_whatever_the_command_name() {
        // A name with a space and parentheses, as a process may choose.
        let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 3 0 987654 123456789 2048 \
                    18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 2 0 0 0 0 0";
        assert_eq!(parse_usage(stat), Some(Usage { cpu_ticks: 325, rss_pages: 2048, start: 987654 }));
        assert_eq!(parse_usage("4242 (x) S 1 2"), None);
        assert_eq!(parse_usage("no parenthesis"), None);
        let me = usage(std::process::id()).unwrap();
        assert!(me.rss_pages > 0 && Some(me.start) == proc_start(std::process::id()));
        assert_eq!(usage(u32::MAX), None);
        assert!(ticks_per_second() > 0 && page_size() >= 4096);
    }

    #[test]
    fn interface_counters_are_read_by_name() {
        let text = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    1234      12    0    0    0     0          0         0     1234      12    0    0    0     0       0          0
wt0123456789ab: 5000 40 1 2 0 0 0 0 7000 50 0 3 0 0 0 0
 short: 1 2 3
";
        let d = parse_net_dev(text);
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d["lo"], NetDev { rx_bytes: 1234, rx_packets: 12, rx_dropped: 0, tx_bytes: 1234, tx_packets: 12, tx_dropped: 0 });
        assert_eq!(d["wt0123456789ab"], NetDev { rx_bytes: 5000, rx_packets: 40, rx_dropped: 2, tx_bytes: 7000, tx_packets: 50, tx_dropped: 3 });
        assert!(net_devs().contains_key("lo"));
    }
}
