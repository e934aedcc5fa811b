//! Children's ends: one thread per process watches its children (through
//! pidfds) and ends the membership of a child whose process ended without
//! saying so (killed, or its monitor failed), so its parent learns of it.

use std::sync::Arc;

use wisp_abi::family::status;

use super::region::{exit_member, lock, RUNNING};
use super::shared::SharedMap;
use crate::sys::wait_child;

/// A child process ended with raw wait status `raw`: if it did not end its
/// membership itself, end it now.
fn child_ended(map: &SharedMap, idx: usize, pid: i32, raw: i32) {
    let st = if libc::WIFSIGNALED(raw) {
        status::signaled(libc::WTERMSIG(raw) as u32)
    } else {
        status::exited(libc::WEXITSTATUS(raw))
    };
    let l = lock(map);
    let m = &l.inner.members[idx];
    if m.pid == pid && m.state == RUNNING {
        exit_member(map, l.inner, idx, st);
    }
}

/// The thread that reaps a process's children.
pub(super) struct Reaper {
    tx: std::sync::mpsc::Sender<(i32, usize, std::os::fd::OwnedFd)>,
    wake: Arc<std::os::fd::OwnedFd>,
}

impl Reaper {
    pub(super) fn start(map: Arc<SharedMap>) -> std::io::Result<Reaper> {
        use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
        let wake = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        let (tx, rx) = std::sync::mpsc::channel::<(i32, usize, std::os::fd::OwnedFd)>();
        let w = wake.clone();
        std::thread::Builder::new().name("reaper".into()).stack_size(128 << 10).spawn(move || {
            crate::sys::thread_started(crate::sys::ThreadRole::Reaper);
            let mut kids: Vec<(i32, usize, std::os::fd::OwnedFd)> = Vec::new();
            loop {
                let ready: Vec<usize> = {
                    let mut fds = vec![PollFd::new(&*w, PollFlags::IN)];
                    fds.extend(kids.iter().map(|k| PollFd::new(&k.2, PollFlags::IN)));
                    if poll(&mut fds, None).is_err() {
                        continue;
                    }
                    if !fds[0].revents().is_empty() {
                        let mut b = [0u8; 8];
                        let _ = rustix::io::read(&*w, &mut b);
                    }
                    (1..fds.len()).filter(|&i| !fds[i].revents().is_empty()).map(|i| i - 1).collect()
                };
                for i in ready.into_iter().rev() {
                    let (pid, idx, _fd) = kids.swap_remove(i);
                    let raw = wait_child(pid).unwrap_or(libc::SIGKILL);
                    child_ended(&map, idx, pid, raw);
                }
                // A child made from a recycled spare is the same process as
                // an earlier one: one watch, for its latest membership.
                for (pid, idx, fd) in rx.try_iter() {
                    match kids.iter_mut().find(|k| k.0 == pid) {
                        Some(k) => k.1 = idx,
                        None => kids.push((pid, idx, fd)),
                    }
                }
            }
        })?;
        Ok(Reaper { tx, wake })
    }

    pub(super) fn watch(&self, pid: i32, idx: usize) -> bool {
        let Ok(pidfd) = rustix::process::pidfd_open(
            rustix::process::Pid::from_raw(pid).expect("a child's pid is positive"),
            rustix::process::PidfdFlags::empty(),
        ) else {
            return false;
        };
        if self.tx.send((pid, idx, pidfd)).is_err() {
            return false;
        }
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
        true
    }
}

/// Watch child `idx` (process `pid`) with a thread of its own (when there
/// is no [`Reaper`]).
pub(super) fn watch_alone(map: Arc<SharedMap>, pid: i32, idx: usize) {
    let _ = std::thread::Builder::new().stack_size(64 << 10).spawn(move || {
        crate::sys::thread_started(crate::sys::ThreadRole::Reaper);
        let raw = wait_child(pid).unwrap_or(libc::SIGKILL);
        child_ended(&map, idx, pid, raw);
    });
}
