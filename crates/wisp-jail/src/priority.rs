//! How a VMM process is scheduled while it prepares: a shell for the pool
//! is made in the background (`SCHED_IDLE`: it runs only on CPU time no
//! one else wants, so a refill never slows the request that emptied the
//! pool), and is a normal process again once it is ready.
//!
//! The daemon's pool thread calls [`background`]; the processes it starts
//! inherit the policy; when one is ready the daemon brings all its threads
//! back ([`foreground_process`]). A jailed process could not do that
//! itself (leaving `SCHED_IDLE` takes `CAP_SYS_NICE` or an `RLIMIT_NICE` it
//! does not get), so it cannot raise itself either. [`can_come_back`]
//! tells the daemon whether it may send its pool to the background at all.

use std::io;

/// Run the calling thread (and the threads and processes it starts) only
/// on otherwise idle CPU time.
pub fn background() -> io::Result<()> {
    set(0, libc::SCHED_IDLE)
}

/// Run the calling thread as a normal one again (nice 0).
pub fn foreground() -> io::Result<()> {
    set(0, libc::SCHED_OTHER)
}

/// Whether the calling thread runs in the background.
pub fn in_background() -> bool {
    // SAFETY: sched_getscheduler has no memory effects.
    unsafe { libc::sched_getscheduler(0) == libc::SCHED_IDLE }
}

/// Whether this process may bring a thread back from the background (a
/// throwaway thread tries).
pub fn can_come_back() -> bool {
    std::thread::spawn(|| background().and_then(|()| foreground()).is_ok()).join().unwrap_or(false)
}

/// Bring every thread of process `pid` back to a normal policy (nice 0).
/// For a process that is not adding threads (a pooled VMM process waits).
pub fn foreground_process(pid: u32) -> io::Result<()> {
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let tid: libc::pid_t =
            t?.file_name().to_str().and_then(|s| s.parse().ok()).ok_or(io::ErrorKind::InvalidData)?;
        set(tid, libc::SCHED_OTHER)?;
    }
    Ok(())
}

fn set(tid: libc::pid_t, policy: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param, read during the call only.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> libc::c_int {
        // SAFETY: sched_getscheduler has no memory effects.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn a_thread_goes_to_the_background_and_is_brought_back() {
        assert!(can_come_back(), "the tests run as root");
        let (tx, rx) = std::sync::mpsc::channel();
        let (back_tx, back_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            background().unwrap();
            tx.send(policy()).unwrap();
            back_rx.recv().unwrap();
            policy()
        });
        assert_eq!(rx.recv().unwrap(), libc::SCHED_IDLE);
        // This whole process (the background thread among its threads).
        foreground_process(std::process::id()).unwrap();
        back_tx.send(()).unwrap();
        assert_eq!(t.join().unwrap(), libc::SCHED_OTHER);
    }
}
