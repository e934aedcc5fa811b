//! `bench ROUNDS`: the round trips `make bench-fork` measures (fork, fork
//! + exit + wait, pipe, message queue, shared memory, kill), printed as
//! "bench NAME NS" like `bench/tools/ipcbench.c` does for processes.

use core::sync::atomic::{AtomicU32, Ordering};

use wisp::family as f;
use wisp::println;

use crate::{e, reap, R, SIGS};

/// Round trips between parent and child: the mean ns per operation or
/// round trip over `rounds`, printed as `bench NAME NS`.
pub(crate) fn bench(rounds: u64) -> R {
    use wisp::time::monotonic_ns;
    let report = |name: &str, t0: u64, n: u64| println!("bench {} {}", name, (monotonic_ns() - t0) / n.max(1));
    // fork + exit + wait, and fork alone (time until fork returns in the parent).
    let mut fork_ns = 0;
    let t0 = monotonic_ns();
    for _ in 0..rounds / 10 + 1 {
        let t = monotonic_ns();
        let c = f::fork().map_err(e)?;
        if c == 0 {
            wisp::exit(0);
        }
        fork_ns += monotonic_ns() - t;
        reap(c)?;
    }
    report("fork_exit_wait", t0, rounds / 10 + 1);
    println!("bench fork {}", fork_ns / (rounds / 10 + 1));
    // pipe ping-pong
    let (ar, aw) = f::pipe().map_err(e)?;
    let (br, bw) = f::pipe().map_err(e)?;
    let q = f::msgget(0, f::IPC_CREAT).map_err(e)?;
    let sid = f::shmget(0, 4096, f::IPC_CREAT).map_err(e)?;
    let m = f::shmat(sid).map_err(e)?;
    let c = f::fork().map_err(e)?;
    let mut b = [0u8; 8];
    if c == 0 {
        for _ in 0..rounds {
            f::read(ar, &mut b).map_err(e)?;
            f::write(bw, &b[..1]).map_err(e)?;
        }
        for _ in 0..rounds {
            f::msgrcv(q, &mut b, 1, false).map_err(e)?;
            f::msgsnd(q, 2, &b[..1]).map_err(e)?;
        }
        let w = &m.words()[0];
        for i in 0..rounds {
            while w.load(Ordering::Acquire) != 2 * i + 1 {
                core::hint::spin_loop();
            }
            w.store(2 * i + 2, Ordering::Release);
        }
        // kill: signal the parent, which answers with a signal
        f::signal(f::SIGUSR1, |_| {
            SIGS.fetch_add(1, Ordering::Relaxed);
        });
        for i in 0..rounds {
            while SIGS.load(Ordering::Relaxed) <= i as u32 {
                f::pause();
            }
            f::kill(f::getppid(), f::SIGUSR2).map_err(e)?;
        }
        wisp::exit(0);
    }
    let t0 = monotonic_ns();
    for _ in 0..rounds {
        f::write(aw, b"p").map_err(e)?;
        f::read(br, &mut b).map_err(e)?;
    }
    report("pipe", t0, rounds);
    let t0 = monotonic_ns();
    for _ in 0..rounds {
        f::msgsnd(q, 1, b"m").map_err(e)?;
        f::msgrcv(q, &mut b, 2, false).map_err(e)?;
    }
    report("msgq", t0, rounds);
    let w = &m.words()[0];
    let t0 = monotonic_ns();
    for i in 0..rounds {
        w.store(2 * i + 1, Ordering::Release);
        while w.load(Ordering::Acquire) != 2 * i + 2 {
            core::hint::spin_loop();
        }
    }
    report("shm", t0, rounds);
    static USR2: AtomicU32 = AtomicU32::new(0);
    f::signal(f::SIGUSR2, |_| {
        USR2.fetch_add(1, Ordering::Relaxed);
    });
    let t0 = monotonic_ns();
    for i in 0..rounds {
        f::kill(c, f::SIGUSR1).map_err(e)?;
        while USR2.load(Ordering::Relaxed) <= i as u32 {
            f::pause();
        }
    }
    report("kill", t0, rounds);
    reap(c)?;
    Ok(())
}
