//! Take VM teardown off the critical path of a one-shot `wisp run`.
//!
//! Destroying a KVM VM costs ~0.7 ms on PVM hosts (and ~0.1 ms on bare
//! metal), all of it paid in `exit()` before the parent sees the status.
//! [`exit_detaching_teardown`] instead hands the VM's file descriptors and
//! address space to a tiny child (`clone(CLONE_VM)` with its own fd table),
//! exits at once, and lets the child release everything once the parent is
//! gone. The work still happens — off the path between "guest exited" and
//! "caller has the status". The toolstack recycles shells instead.

use std::io::Write;

const CHILD_STACK: usize = 16 * 1024;

#[repr(C, align(16))]
struct Stack([u8; CHILD_STACK]);

static mut STACK: Stack = Stack([0; CHILD_STACK]);

/// Runs in the child: close stdio (so readers of our output see EOF as soon
/// as the parent exits), wait for the parent to exit (EOF on the pipe), then
/// exit, dropping the last references to the VM and the address space.
extern "C" fn reaper(arg: *mut libc::c_void) -> libc::c_int {
    let fds = arg as usize;
    let (rd, wr) = ((fds & 0xffff_ffff) as libc::c_int, (fds >> 32) as libc::c_int);
    // SAFETY: only raw, async-signal-safe system calls on descriptors this
    // child owns (its own copy of the fd table); no allocation, no locks.
    unsafe {
        libc::close(wr);
        libc::close(0);
        libc::close(1);
        libc::close(2);
        let mut b = 0u8;
        while libc::read(rd, &mut b as *mut u8 as *mut libc::c_void, 1) < 0
            && *libc::__errno_location() == libc::EINTR
        {}
        libc::syscall(libc::SYS_exit, 0);
    }
    0
}

/// Flush stdio and exit with `code`, leaving VM teardown to a detached
/// child. Falls back to a plain exit if the child cannot be created. Call
/// only from a single-threaded process (after every vCPU and watchdog
/// thread has been joined).
pub fn exit_detaching_teardown(code: i32) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let mut p = [0 as libc::c_int; 2];
    // SAFETY: `pipe2` writes two descriptors into `p`. `clone` runs `reaper`
    // on a dedicated static stack that nothing else uses (this function runs
    // once, then the parent exits); with CLONE_VM the child shares memory but
    // touches only that stack and its own fd table copy. `_exit` ends the
    // parent without running destructors, so no state the child could see
    // is torn down under it.
    unsafe {
        if libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) == 0 {
            let arg = (p[0] as u32 as usize) | ((p[1] as u32 as usize) << 32);
            let top = (&raw mut STACK).cast::<u8>().add(CHILD_STACK);
            libc::clone(reaper, top.cast(), libc::CLONE_VM | libc::SIGCHLD, arg as *mut libc::c_void);
        }
        libc::_exit(code)
    }
}
