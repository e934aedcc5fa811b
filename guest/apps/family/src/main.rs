//! `family MODE [ARGS]`: fork and family IPC, exercised. Each mode prints
//! what it saw (the tests check the lines) and exits 0 when all was as
//! expected, 1 otherwise.
//!
//! Modes: cow, tree, many N, pipe KIB, siblings, signals, msgq, shm,
//! shm-after-detach, crash, bomb, hog MIB, victim, nap N, idle-wait, orphan-eof,
//! daemonize, late, pids HOSTPID, hold KEY, cross HOSTPID KEY, writers K N,
//! corrupt (`rings.rs`), and `bench ROUNDS` (round-trip latencies for
//! `make bench-fork`).
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use wisp::family::{self as f, status, Errno};
use wisp::println;

wisp::main!(main, wisp::Manifest::new().features(wisp::features::FORK | wisp::features::FAMILY));

static mut GLOBAL: u64 = 1;

fn global() -> u64 {
    // SAFETY: single-threaded guest; no reference is kept.
    unsafe { core::ptr::read_volatile(&raw const GLOBAL) }
}

fn set_global(v: u64) {
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(&raw mut GLOBAL, v) }
}

fn main() -> i32 {
    let mode = wisp::env::arg(1).unwrap_or("cow");
    let n = |i: usize, d: u64| wisp::env::arg(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let r = match mode {
        "cow" => cow(),
        "cow-again" => cow_again(n(2, 3) as u32),
        "tree" => tree(),
        "many" => many(n(2, 8) as u32),
        "pipe" => pipe(n(2, 100) as usize),
        "siblings" => siblings(),
        "signals" => signals(),
        "msgq" => msgq(),
        "shm" => shm(),
        "shm-after-detach" => shm_after_detach(),
        "crash" => crash(),
        "bomb" => bomb(),
        "hog" => hog(n(2, 8) as usize),
        "victim" => victim(),
        "nap" => nap(n(2, 2) as u32),
        "idle-wait" => idle_wait(),
        "orphan-eof" => orphan_eof(),
        "daemonize" => daemonize(),
        "late" => late(),
        "hold" => hold(n(2, 77) as i64),
        "cross" => cross(n(2, 0) as u32, n(3, 77) as i64),
        "pids" => pids(n(2, 0) as u32),
        "bench" => bench::bench(n(2, 1000)),
        "writers" => rings::writers(n(2, 4) as u8, n(3, 200) as u32),
        "corrupt" => rings::corrupt(),
        _ => {
            println!("usage: family MODE (see the source)");
            return 2;
        }
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            println!("FAILED: {}", e);
            1
        }
    }
}

type R = Result<(), alloc::string::String>;

macro_rules! ensure {
    ($c:expr, $($t:tt)*) => {
        if !$c {
            return Err(alloc::format!($($t)*));
        }
    };
}

mod bench;
mod rings;

fn e(x: Errno) -> alloc::string::String {
    alloc::format!("{x}")
}

/// Wait for `pid` and return its exit code (error if it did not exit).
fn reap(pid: u32) -> Result<i32, alloc::string::String> {
    let (p, st) = f::waitpid(pid as i64, false).map_err(e)?.ok_or("no child ended")?;
    ensure!(p == pid, "waited for {pid}, got {p}");
    status::exit_code(st).ok_or_else(|| alloc::format!("child {pid} ended by signal {:?}", status::term_signal(st)))
}

fn cow() -> R {
    let me = f::getpid();
    let heap = vec![5u8; 64 * 1024];
    let (p2c_r, p2c_w) = f::pipe().map_err(e)?;
    let (c2p_r, c2p_w) = f::pipe().map_err(e)?;
    set_global(1);
    let pid = f::fork().map_err(e)?;
    let mut b = [0u8; 1];
    if pid == 0 {
        // Child: sees the parent's memory as it was at fork.
        let ok = f::getppid() == me && f::getpid() != me && heap.iter().all(|&x| x == 5);
        f::read(p2c_r, &mut b).map_err(e)?; // parent has written GLOBAL = 2 by now
        println!("child: fork returned 0, ppid ok {}, sees global {}", ok, global());
        set_global(3);
        f::write(c2p_w, b"x").map_err(e)?;
        wisp::exit(if ok && global() == 3 { 7 } else { 1 });
    }
    println!("parent: fork returned a pid {}", pid != me && pid > 0);
    set_global(2);
    f::write(p2c_w, b"x").map_err(e)?;
    f::read(c2p_r, &mut b).map_err(e)?; // child has written GLOBAL = 3 by now
    println!("parent: sees global {}", global());
    let code = reap(pid)?;
    println!("parent: child exited {}", code);
    ensure!(global() == 2 && code == 7, "copy-on-write broken");
    ensure!(f::waitpid(-1, true) == Err(Errno::ECHILD), "a second wait found a child");
    println!("cow ok");
    Ok(())
}

/// Fork, wait, and fork again, `rounds` times: each child must see the
/// parent's memory as it was at its own fork (the later forks are handed to
/// a spare monitor process prepared during the wait), and neither side
/// sees the other's writes afterwards.
fn cow_again(rounds: u32) -> R {
    let mut heap = vec![0u8; 256 * 1024];
    for round in 1..=rounds {
        let v = round as u64 * 10;
        set_global(v);
        heap.iter_mut().enumerate().for_each(|(i, x)| *x = (i as u32 ^ round) as u8);
        let (p2c_r, p2c_w) = f::pipe().map_err(e)?;
        let (c2p_r, c2p_w) = f::pipe().map_err(e)?;
        let pid = f::fork().map_err(e)?;
        let mut b = [0u8; 1];
        if pid == 0 {
            let sees = global() == v && heap.iter().enumerate().all(|(i, &x)| x == (i as u32 ^ round) as u8);
            f::read(p2c_r, &mut b).map_err(e)?; // the parent has written by now
            let untouched = global() == v && heap[1] == (1 ^ round) as u8;
            set_global(v + 7);
            heap[1] = 0xee;
            f::write(c2p_w, b"x").map_err(e)?;
            wisp::exit(if sees && untouched { 7 } else { 1 });
        }
        set_global(v + 1);
        heap[1] = 0xdd;
        f::write(p2c_w, b"x").map_err(e)?;
        f::read(c2p_r, &mut b).map_err(e)?; // the child has written by now
        let code = reap(pid)?;
        println!("round {}: child exited {}, parent sees global {} heap {:#x}", round, code, global(), heap[1]);
        ensure!(code == 7 && global() == v + 1 && heap[1] == 0xdd, "copy-on-write broken");
        for fd in [p2c_r, p2c_w, c2p_r, c2p_w] {
            f::close(fd).map_err(e)?;
        }
    }
    println!("cow-again ok");
    Ok(())
}

fn tree() -> R {
    let root = f::getpid();
    let c = f::fork().map_err(e)?;
    if c == 0 {
        let child = f::getpid();
        let g = f::fork().map_err(|x| alloc::format!("grandchild fork: {x}"))?;
        if g == 0 {
            let ok = f::getppid() == child && child != root;
            println!("grandchild: parent is the child {}", ok);
            wisp::exit(if ok { 3 } else { 1 });
        }
        let code = reap(g)?;
        println!("child: grandchild exited {}", code);
        wisp::exit(if code == 3 { 5 } else { 1 });
    }
    let code = reap(c)?;
    println!("root: child exited {}", code);
    ensure!(code == 5, "tree broken");
    println!("tree ok");
    Ok(())
}

fn many(n: u32) -> R {
    let mut pids = vec![];
    for i in 0..n {
        let pid = f::fork().map_err(|x| alloc::format!("fork {i}: {x}"))?;
        if pid == 0 {
            wisp::exit(10 + i as i32);
        }
        pids.push(pid);
    }
    let mut sum = 0;
    for _ in 0..n {
        let (p, st) = f::wait().map_err(e)?;
        ensure!(pids.contains(&p), "unknown child {p}");
        sum += status::exit_code(st).ok_or("a child was killed")?;
    }
    let want: i32 = (0..n as i32).map(|i| 10 + i).sum();
    println!("many: {} children, exit codes sum {} (want {})", n, sum, want);
    ensure!(sum == want, "wrong exit codes");
    ensure!(f::wait() == Err(Errno::ECHILD), "children left");
    println!("many ok");
    Ok(())
}

fn checksum(d: &[u8]) -> u64 {
    d.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

fn pipe(kib: usize) -> R {
    let (r, w) = f::pipe().map_err(e)?;
    let (ar, aw) = f::pipe().map_err(e)?;
    let data: alloc::vec::Vec<u8> = (0..kib * 1024).map(|i| (i * 7 + i / 251) as u8).collect();
    let pid = f::fork().map_err(e)?;
    if pid == 0 {
        f::close(w).map_err(e)?;
        let mut got = vec![];
        let mut buf = [0u8; 3000];
        loop {
            let n = f::read(r, &mut buf).map_err(e)?;
            if n == 0 {
                break; // EOF: the parent closed its end
            }
            got.extend_from_slice(&buf[..n]);
        }
        f::write(aw, &checksum(&got).to_le_bytes()).map_err(e)?;
        f::write(aw, &(got.len() as u64).to_le_bytes()).map_err(e)?;
        wisp::exit(0);
    }
    f::close(r).map_err(e)?;
    f::write(w, &data).map_err(e)?;
    f::close(w).map_err(e)?;
    let mut b = [0u8; 16];
    let mut got = 0;
    while got < 16 {
        got += f::read(ar, &mut b[got..]).map_err(e)?;
    }
    let (sum, len) = (u64::from_le_bytes(b[..8].try_into().unwrap()), u64::from_le_bytes(b[8..].try_into().unwrap()));
    println!("pipe: child read {} bytes, checksum match {}", len, sum == checksum(&data));
    ensure!(sum == checksum(&data) && len as usize == data.len(), "pipe corrupted data");
    ensure!(reap(pid)? == 0, "child failed");
    // No reader left: EPIPE.
    ensure!(f::write(aw, b"z").is_ok(), "own pipe");
    f::close(ar).map_err(e)?;
    ensure!(f::write(aw, b"z") == Err(Errno::EPIPE), "write without reader did not fail with EPIPE");
    ensure!(f::read(ar, &mut b) == Err(Errno::EBADF), "closed descriptor readable");
    println!("pipe ok");
    Ok(())
}

fn siblings() -> R {
    let (r, w) = f::pipe().map_err(e)?;
    let key = f::ftok("/siblings", 1);
    let shm = f::shmget(f::ftok("/siblings-shm", 1), 4096, f::IPC_CREAT).map_err(e)?;
    let a = f::fork().map_err(e)?;
    if a == 0 {
        // Sibling A: writes to the pipe, queues messages, fills shared memory
        // (all set up lazily: A and B share no channel but the family's).
        let q = f::msgget(key, f::IPC_CREAT).map_err(e)?;
        let m = f::shmat(shm).map_err(e)?;
        m.write(0, b"hello through shared memory");
        f::msgsnd(q, 2, b"second type").map_err(e)?;
        f::msgsnd(q, 1, b"first type").map_err(e)?;
        f::write(w, b"hello sibling").map_err(e)?;
        wisp::exit(0);
    }
    let b = f::fork().map_err(e)?;
    if b == 0 {
        let mut buf = [0u8; 64];
        let n = f::read(r, &mut buf).map_err(e)?;
        let q = f::msgget(key, f::IPC_CREAT).map_err(e)?;
        let (n1, t1) = f::msgrcv(q, &mut buf[32..], -2, false).map_err(e)?;
        let first = core::str::from_utf8(&buf[32..32 + n1]).unwrap_or("?") == "first type" && t1 == 1;
        let m = f::shmat(shm).map_err(e)?;
        let mut s = [0u8; 27];
        m.read(0, &mut s);
        let ok = &buf[..n] == b"hello sibling" && first && &s == b"hello through shared memory";
        println!("sibling B: pipe {:?}, lowest type first {}, shm {:?}", core::str::from_utf8(&buf[..n]).unwrap_or("?"), first, core::str::from_utf8(&s).unwrap_or("?"));
        wisp::exit(if ok { 0 } else { 1 });
    }
    ensure!(reap(a)? == 0, "sibling A failed");
    ensure!(reap(b)? == 0, "sibling B failed");
    println!("siblings ok");
    Ok(())
}

pub(crate) static SIGS: AtomicU32 = AtomicU32::new(0);
static CHLD: AtomicU32 = AtomicU32::new(0);

fn signals() -> R {
    f::signal(f::SIGCHLD, |_| {
        CHLD.fetch_add(1, Ordering::Relaxed);
    });
    let (r, w) = f::pipe().map_err(e)?;
    let (ready_r, ready_w) = f::pipe().map_err(e)?;
    // 1. A handler runs; the interrupted read goes on afterwards.
    let c = f::fork().map_err(e)?;
    if c == 0 {
        f::signal(f::SIGUSR1, |s| {
            SIGS.fetch_add(s, Ordering::Relaxed);
        });
        f::write(ready_w, b"r").map_err(e)?;
        let mut b = [0u8; 1];
        let n = f::read(r, &mut b).map_err(e)?; // blocks; SIGUSR1 arrives meanwhile
        let got = SIGS.load(Ordering::Relaxed);
        println!("child: SIGUSR1 handler ran {}, then read {} byte", got == f::SIGUSR1, n);
        wisp::exit(if got == f::SIGUSR1 && n == 1 { 0 } else { 1 });
    }
    let mut b = [0u8; 1];
    f::read(ready_r, &mut b).map_err(e)?;
    f::kill(c, f::SIGUSR1).map_err(e)?;
    wisp::time::sleep(core::time::Duration::from_millis(20));
    f::write(w, b"x").map_err(e)?;
    ensure!(reap(c)? == 0, "handler child failed");
    // 2. Default action of SIGTERM: exit 128 + 15.
    let c = f::fork().map_err(e)?;
    if c == 0 {
        f::write(ready_w, b"r").map_err(e)?;
        let _ = f::read(r, &mut b);
        wisp::exit(0);
    }
    f::read(ready_r, &mut b).map_err(e)?;
    f::kill(c, f::SIGTERM).map_err(e)?;
    let code = reap(c)?;
    println!("parent: SIGTERM child exited {}", code);
    ensure!(code == 143, "SIGTERM default action");
    // 3. SIGKILL ends even a spinning child.
    let c = f::fork().map_err(e)?;
    if c == 0 {
        f::write(ready_w, b"r").map_err(e)?;
        loop {
            core::hint::spin_loop();
        }
    }
    f::read(ready_r, &mut b).map_err(e)?;
    f::kill(c, f::SIGKILL).map_err(e)?;
    let (_, st) = f::waitpid(c as i64, false).map_err(e)?.ok_or("no child")?;
    println!("parent: SIGKILLed child ended by signal {:?}", status::term_signal(st));
    ensure!(status::term_signal(st) == Some(f::SIGKILL), "SIGKILL");
    let n = CHLD.load(Ordering::Relaxed);
    println!("parent: SIGCHLD received {}", n >= 1);
    ensure!(n >= 1, "no SIGCHLD");
    ensure!(f::kill(999_999, f::SIGUSR1) == Err(Errno::ESRCH), "kill of no VM");
    println!("signals ok");
    Ok(())
}

fn msgq() -> R {
    let key = f::ftok("/queue", 7);
    ensure!(f::msgget(key, 0) == Err(Errno::ENOENT), "queue existed before");
    let q = f::msgget(key, f::IPC_CREAT).map_err(e)?;
    ensure!(f::msgget(key, f::IPC_CREAT | f::IPC_EXCL) == Err(Errno::EEXIST), "IPC_EXCL");
    ensure!(f::msgget(key, 0) == Ok(q), "same key, same queue");
    let mut buf = [0u8; 64];
    ensure!(f::msgrcv(q, &mut buf, 0, true) == Err(Errno::ENOMSG), "empty queue");
    ensure!(f::msgsnd(q, 0, b"bad type") == Err(Errno::EINVAL), "type 0");
    let c = f::fork().map_err(e)?;
    if c == 0 {
        let q = f::msgget(key, 0).map_err(e)?;
        for i in 1..=3i64 {
            f::msgsnd(q, i, alloc::format!("message {i}").as_bytes()).map_err(e)?;
        }
        f::msgsnd(q, 9, &[b'x'; 100]).map_err(e)?;
        wisp::exit(0);
    }
    let (n, t) = f::msgrcv(q, &mut buf, 3, false).map_err(e)?;
    ensure!(t == 3 && &buf[..n] == b"message 3", "type 3 first");
    let (n, t) = f::msgrcv(q, &mut buf, 0, false).map_err(e)?;
    ensure!(t == 1 && &buf[..n] == b"message 1", "then the oldest");
    ensure!(f::msgrcv(q, &mut buf[..10], 9, false) == Err(Errno::E2BIG), "too long");
    let (n, _) = f::msgrcv(q, &mut buf, 2, false).map_err(e)?;
    ensure!(&buf[..n] == b"message 2", "type 2");
    ensure!(reap(c)? == 0, "sender failed");
    f::msgrmid(q).map_err(e)?;
    ensure!(f::msgrcv(q, &mut buf, 0, true) == Err(Errno::EINVAL), "removed queue still there");
    removed_while_blocked()?;
    println!("msgq ok");
    Ok(())
}

/// A receiver blocked on a queue that is removed gets EIDRM. The receiver
/// says (a pipe byte) that it is about to receive; the parent waits until
/// it sleeps in its monitor (`family::parked`, polled for at most 2 s) and
/// removes the queue then. A receiver that had not reached the queue when
/// it went (it slept elsewhere, or not within 2 s) finds none (EINVAL),
/// which proves nothing either way, and the round is run again on a new
/// queue. Any other outcome fails, and so do 20 rounds without a blocked
/// receiver.
fn removed_while_blocked() -> R {
    const ROUNDS: u32 = 20;
    let (ready_r, ready_w) = f::pipe().map_err(e)?;
    for round in 1..=ROUNDS {
        let q = f::msgget(0, f::IPC_CREAT).map_err(e)?;
        let c = f::fork().map_err(e)?;
        if c == 0 {
            let mut buf = [0u8; 64];
            f::write(ready_w, b"r").map_err(e)?;
            let r = f::msgrcv(q, &mut buf, 42, false);
            println!("child: blocked receive ended with {:?}", r.map_err(|x| x.name()));
            wisp::exit(match r {
                Err(Errno::EIDRM) => 0,
                Err(Errno::EINVAL) => 2,
                _ => 1,
            });
        }
        let mut b = [0u8; 1];
        f::read(ready_r, &mut b).map_err(e)?;
        let deadline = wisp::time::uptime() + core::time::Duration::from_secs(2);
        while f::parked(c) == Some(false) && wisp::time::uptime() < deadline {
            core::hint::spin_loop();
        }
        f::msgrmid(q).map_err(e)?;
        match reap(c)? {
            0 => {
                println!("msgq: EIDRM in round {}", round);
                return Ok(());
            }
            2 => continue,
            _ => return Err("a receiver on a removed queue got neither EIDRM nor EINVAL".into()),
        }
    }
    Err(alloc::format!("no receiver was blocked when its queue was removed in {ROUNDS} rounds"))
}

/// The parent leaves at once; the child lives on. It learns that its parent
/// has gone from a pipe only the parent can write: end of file once the
/// parent's end is closed, which its exit does.
fn daemonize() -> R {
    let (r, w) = f::pipe().map_err(e)?;
    if f::fork().map_err(e)? == 0 {
        f::close(w).map_err(e)?;
        let mut b = [0u8; 1];
        let n = f::read(r, &mut b).map_err(e)?;
        println!("daemonize: child {} outlived its parent {}", f::getpid(), n == 0 && f::getppid() == 0);
        wisp::exit(0);
    }
    Ok(())
}

/// Forks when told to: the root forks a member at once, then each of the
/// two waits (a signal-like wait, no timer) for a stop request
/// (`wisp stop`) and, told to stop, forks a successor and exits 0; the
/// successor says who forked it and waits for a stop of its own (which ends
/// it with 143). So a test decides when a VM forks (e.g. after a daemon
/// restart).
fn late() -> R {
    wisp::process::on_stop(late_fork);
    if f::fork().map_err(e)? == 0 {
        println!("late: member {} waiting", f::getpid());
    } else {
        println!("late: root {} waiting", f::getpid());
    }
    loop {
        f::pause();
    }
}

fn late_fork() {
    let me = f::getpid();
    match f::fork() {
        Ok(0) => {
            wisp::process::on_stop(|| wisp::exit(143));
            println!("late: {} forked by {}", f::getpid(), me);
            loop {
                f::pause();
            }
        }
        Ok(c) => {
            println!("late: {} forked {} and exits", me, c);
            wisp::exit(0)
        }
        Err(x) => {
            println!("late: {} could not fork: {}", me, x.name());
            wisp::exit(1)
        }
    }
}

fn shm() -> R {
    let id = f::shmget(0, 8192, f::IPC_CREAT).map_err(e)?;
    let m = f::shmat(id).map_err(e)?;
    ensure!(m.len() == 8192, "size {}", m.len());
    let counter: &AtomicU64 = &m.words()[0];
    counter.store(0, Ordering::SeqCst);
    const N: u64 = 20_000;
    let c = f::fork().map_err(e)?;
    if c == 0 {
        // Inherited attachment.
        for _ in 0..N {
            m.words()[0].fetch_add(1, Ordering::SeqCst);
        }
        m.words()[1].store(0xfeed, Ordering::SeqCst);
        wisp::exit(0);
    }
    for _ in 0..N {
        counter.fetch_add(1, Ordering::SeqCst);
    }
    ensure!(reap(c)? == 0, "child failed");
    let total = counter.load(Ordering::SeqCst);
    println!("shm: counter {} (want {}), child's word {:#x}", total, 2 * N, m.words()[1].load(Ordering::SeqCst));
    ensure!(total == 2 * N && m.words()[1].load(Ordering::SeqCst) == 0xfeed, "shared memory not shared");
    f::shmdt(m).map_err(e)?;
    f::shmrmid(id).map_err(e)?;
    ensure!(f::shmat(id).is_err(), "removed segment attachable");
    println!("shm ok");
    Ok(())
}

fn shm_after_detach() -> R {
    let id = f::shmget(0, 4096, f::IPC_CREAT).map_err(e)?;
    let m = f::shmat(id).map_err(e)?;
    m.write(0, b"x");
    let addr = m.addr();
    f::shmdt(m).map_err(e)?;
    println!("detached; touching {:#x}", addr);
    // SAFETY: deliberately wrong: the monitor must stop the VM here.
    unsafe { core::ptr::write_volatile(addr as *mut u8, 1) };
    println!("FAILED: detached memory still writable");
    Ok(())
}

fn crash() -> R {
    f::signal(f::SIGCHLD, |_| {
        CHLD.fetch_add(1, Ordering::Relaxed);
    });
    let c = f::fork().map_err(e)?;
    if c == 0 {
        // SAFETY: deliberately wrong: a null write stops this VM.
        unsafe { core::ptr::write_volatile(core::ptr::null_mut::<u8>(), 1) };
        wisp::exit(0);
    }
    let (p, st) = f::waitpid(c as i64, false).map_err(e)?.ok_or("no child")?;
    println!("parent: crashed child {} ended by signal {:?}", p == c, status::term_signal(st));
    ensure!(status::term_signal(st) == Some(f::SIGSEGV), "crash status");
    // SIGCHLD arrives with (or right after) the wait.
    let _ = f::getpid();
    println!("parent: SIGCHLD {}", CHLD.load(Ordering::Relaxed) >= 1);
    ensure!(CHLD.load(Ordering::Relaxed) >= 1, "no SIGCHLD");
    println!("parent: still fine, global {}", global());
    println!("crash ok");
    Ok(())
}

fn orphan_eof() -> R {
    // A grandchild holds the pipe's only write end; its parent exits and it
    // dies with it (direct mode) with nobody to reap it: the family still
    // notices, and the reader gets end of file.
    let (r, w) = f::pipe().map_err(e)?;
    let a = f::fork().map_err(e)?;
    if a == 0 {
        let g = f::fork().map_err(e)?;
        if g == 0 {
            wisp::time::sleep(core::time::Duration::from_secs(60));
            wisp::exit(0);
        }
        wisp::exit(0);
    }
    f::close(w).map_err(e)?;
    ensure!(reap(a)? == 0, "child failed");
    let mut b = [0u8; 8];
    let n = f::read(r, &mut b).map_err(e)?;
    println!("orphan-eof: read returned {}", n);
    ensure!(n == 0, "no EOF");
    println!("orphan-eof ok");
    Ok(())
}

fn idle_wait() -> R {
    // The parent blocks in a read for a second, then in wait: parked, no CPU.
    let (r, w) = f::pipe().map_err(e)?;
    let c = f::fork().map_err(e)?;
    if c == 0 {
        f::close(r).map_err(e)?;
        wisp::time::sleep(core::time::Duration::from_secs(1));
        f::write(w, b"done").map_err(e)?;
        wisp::exit(0);
    }
    f::close(w).map_err(e)?;
    let mut b = [0u8; 8];
    let n = f::read(r, &mut b).map_err(e)?;
    let eof = f::read(r, &mut b).map_err(e)?;
    ensure!(&b[..n] == b"done" && eof == 0, "read {n} then {eof}");
    ensure!(reap(c)? == 0, "child failed");
    println!("idle-wait ok");
    Ok(())
}

fn nap(n: u32) -> R {
    // N children sleep a minute; the parent reports how each ended.
    for _ in 0..n {
        if f::fork().map_err(e)? == 0 {
            println!("nap: child {} sleeping", f::getpid());
            wisp::time::sleep(core::time::Duration::from_secs(60));
            wisp::exit(0);
        }
    }
    for _ in 0..n {
        let (p, st) = f::wait().map_err(e)?;
        println!("nap: child {} ended: exit {:?} signal {:?}", p, status::exit_code(st), status::term_signal(st));
    }
    println!("nap ok");
    Ok(())
}

fn victim() -> R {
    // The child's monitor process gets SIGKILLed from outside (the test).
    let (r, _w) = f::pipe().map_err(e)?;
    let c = f::fork().map_err(e)?;
    if c == 0 {
        println!("victim: child pid {}", f::getpid());
        let mut b = [0u8; 1];
        let _ = f::read(r, &mut b); // blocks until killed
        wisp::exit(0);
    }
    let (_, st) = f::waitpid(c as i64, false).map_err(e)?.ok_or("no child")?;
    println!("victim: parent saw the child end by signal {:?}", status::term_signal(st));
    ensure!(status::term_signal(st) == Some(f::SIGKILL), "status");
    println!("victim ok");
    Ok(())
}

fn bomb() -> R {
    // Every VM forks until the family is full; children then wait for their
    // own children and exit.
    let root = f::getpid();
    let mut kids = 0;
    let err = loop {
        match f::fork() {
            Ok(0) => {
                kids = 0;
                continue;
            }
            Ok(_) => kids += 1,
            Err(x) => break x,
        }
    };
    for _ in 0..kids {
        let _ = f::wait();
    }
    if f::getpid() != root {
        wisp::exit(0);
    }
    println!("bomb: fork failed with {} after {} direct children", err.name(), kids);
    ensure!(err == Errno::EAGAIN, "wrong error");
    ensure!(f::wait() == Err(Errno::ECHILD), "children left");
    // The family is empty again: forking works.
    let c = f::fork().map_err(e)?;
    if c == 0 {
        wisp::exit(4);
    }
    ensure!(reap(c)? == 4, "fork after the bomb");
    println!("bomb ok");
    Ok(())
}

/// A fork bomb that dirties memory: every VM forks until it cannot, and
/// each child first writes `mib` MiB of memory of its own (the family's
/// copy-on-write growth) and then forks on; then all of them hold on to
/// what they wrote. Only the host's limits stop it.
fn hog(mib: usize) -> R {
    let mut held: alloc::vec::Vec<alloc::vec::Vec<u8>> = alloc::vec::Vec::new();
    let mut kids = 0u32;
    let err = loop {
        match f::fork() {
            Ok(0) => {
                kids = 0;
                // The parent's share stays the parent's (copy-on-write);
                // the heap it took is reused, and every page written is a
                // new page of the family.
                held.clear();
                let mut v = alloc::vec::Vec::with_capacity(mib << 20);
                v.resize(mib << 20, 0u8);
                // A write to every page: each one becomes the child's own.
                for i in (0..v.len()).step_by(4096) {
                    // SAFETY: `i` is within `v`.
                    unsafe { core::ptr::write_volatile(v.as_mut_ptr().add(i), (i >> 12) as u8 | 1) };
                }
                held.push(v);
                println!("hog: {} wrote {} MiB", f::getpid(), mib);
            }
            Ok(_) => kids += 1,
            Err(x) => break x,
        }
    };
    println!("hog: {} holds on after {} children ({})", f::getpid(), kids, err.name());
    loop {
        wisp::time::sleep(core::time::Duration::from_secs(3600));
    }
}

fn hold(key: i64) -> R {
    f::msgget(key, f::IPC_CREAT).map_err(e)?;
    println!("hold: pid {} key {}", f::getpid(), key);
    wisp::time::sleep(core::time::Duration::from_secs(30));
    Ok(())
}

/// Another family's VM (`other`: the host pid of its monitor process) is
/// out of reach: no pid of this family names it, and its queue's key means
/// nothing here.
fn cross(other: u32, key: i64) -> R {
    let k = f::kill(other, f::SIGUSR1);
    let w = f::waitpid(other as i64, true);
    let q = f::msgget(key, 0);
    println!("cross: kill {:?}, waitpid {:?}, msgget {:?}", k.map_err(|x| x.name()), w.map_err(|x| x.name()), q.map_err(|x| x.name()));
    ensure!(k == Err(Errno::ESRCH) && w == Err(Errno::ECHILD) && q == Err(Errno::ENOENT), "another family reachable");
    println!("cross ok");
    Ok(())
}

/// Family pids: the root is 1, a child 2, a grandchild 3; wait returns
/// them; an ended child's pid is not handed out again (the next child is
/// 4); and `host`, a live host process's pid (the test's), names nothing
/// here: `ESRCH`, as for any pid no member has.
fn pids(host: u32) -> R {
    let (me, parent) = (f::getpid(), f::getppid());
    println!("pids: root {} parent {}", me, parent);
    ensure!(me == 1 && parent == 0, "the root's pids");
    let c = f::fork().map_err(e)?;
    if c == 0 {
        let g = f::fork().map_err(e)?;
        if g == 0 {
            let (me, parent) = (f::getpid(), f::getppid());
            println!("pids: grandchild {} parent {}", me, parent);
            wisp::exit(if me == 3 && parent == 2 { 0 } else { 1 });
        }
        let code = reap(g)?;
        let (me, parent) = (f::getpid(), f::getppid());
        println!("pids: child {} parent {} forked {} which exited {}", me, parent, g, code);
        wisp::exit(if me == 2 && parent == 1 && g == 3 && code == 0 { 0 } else { 1 });
    }
    let (p, st) = f::waitpid(-1, false).map_err(e)?.ok_or("no child ended")?;
    println!("pids: fork returned {}, wait returned {} with exit {:?}", c, p, status::exit_code(st));
    ensure!(c == 2 && p == 2 && status::exit_code(st) == Some(0), "the child's pids");
    let d = f::fork().map_err(e)?;
    if d == 0 {
        wisp::exit(0);
    }
    println!("pids: the next fork returned {}", d);
    ensure!(d == 4 && reap(d)? == 0, "a pid handed out again");
    let name = |r: Result<(), Errno>| r.map_err(|x| x.name());
    let (probe, sig) = (f::kill(host, 0), f::kill(host, f::SIGUSR1));
    println!("pids: kill of host pid {}: {:?}, {:?}; waitpid {:?}", host, name(probe), name(sig), f::waitpid(host as i64, true).map_err(|x| x.name()));
    ensure!(host > 1 && probe == Err(Errno::ESRCH) && sig == Err(Errno::ESRCH), "a host pid answered");
    ensure!(f::kill(2, 0) == Err(Errno::ESRCH) && f::kill(1, 0) == Ok(()), "waited-for child, or self");
    println!("pids ok");
    Ok(())
}
