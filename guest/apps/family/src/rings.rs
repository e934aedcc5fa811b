//! Modes for the fast path of family IPC (the rings and cells on the
//! family's shared page): `writers K N` (K children write N records each
//! into one pipe and one queue at once; every record must arrive whole and
//! in each writer's order) and `corrupt` (a child writes over a pipe's and
//! a queue's ring and leaves a lock held: only its own calls fail, and the
//! family's pipes and queues work on).

use alloc::vec::Vec;
use core::sync::atomic::Ordering;

use wisp::abi::family::limits::PIPE_BUF;
use wisp::abi::family::rings::{Rings, RINGS_GPA};
use wisp::abi::family::{op, Call};
use wisp::family::{self as f, Errno};
use wisp::println;

use crate::{e, reap, R};

/// Record `seq` of writer `w`: [w, seq (4 bytes), len (2 bytes)] then
/// `len` bytes that depend on all three; at most `PIPE_BUF` in all.
fn record(w: u8, seq: u32) -> Vec<u8> {
    let len = 1 + ((seq as usize * 37 + w as usize * 11) % 900);
    let mut r = Vec::with_capacity(7 + len);
    r.push(w);
    r.extend_from_slice(&seq.to_le_bytes());
    r.extend_from_slice(&(len as u16).to_le_bytes());
    r.extend((0..len).map(|i| (i as u32 ^ seq.wrapping_mul(31) ^ (w as u32 * 7)) as u8));
    assert!(r.len() <= PIPE_BUF);
    r
}

pub(crate) fn writers(k: u8, n: u32) -> R {
    let (r, w) = f::pipe().map_err(e)?;
    let q = f::msgget(0, f::IPC_CREAT).map_err(e)?;
    let mut kids = Vec::new();
    for i in 0..k {
        let pid = f::fork().map_err(e)?;
        if pid == 0 {
            f::close(r).map_err(e)?;
            for seq in 0..n {
                let rec = record(i, seq);
                ensure!(f::write(w, &rec).map_err(e)? == rec.len(), "short write");
            }
            // The parent reads the queue once every pipe writer is done.
            f::close(w).map_err(e)?;
            for seq in 0..n {
                f::msgsnd(q, i as i64 + 1, &record(i, seq)).map_err(e)?;
            }
            wisp::exit(0);
        }
        kids.push(pid);
    }
    f::close(w).map_err(e)?;
    // The pipe: a byte stream of whole records (writes up to PIPE_BUF are
    // atomic), each writer's in its order.
    let mut next = alloc::vec![0u32; k as usize];
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1500];
    loop {
        let got = f::read(r, &mut chunk).map_err(e)?;
        if got == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..got]);
        while buf.len() >= 7 {
            let len = u16::from_le_bytes([buf[5], buf[6]]) as usize;
            if buf.len() < 7 + len {
                break;
            }
            let (wr, seq) = (buf[0], u32::from_le_bytes(buf[1..5].try_into().unwrap()));
            ensure!(wr < k, "a record from writer {wr}: torn or mixed");
            ensure!(seq == next[wr as usize], "writer {wr}: record {seq} where {} was due", next[wr as usize]);
            ensure!(buf[..7 + len] == record(wr, seq)[..], "writer {wr} record {seq}: bytes differ");
            next[wr as usize] += 1;
            buf.drain(..7 + len);
        }
    }
    ensure!(buf.is_empty() && next.iter().all(|&c| c == n), "pipe: {next:?} records of {n} each, {} bytes left", buf.len());
    // The queue: each writer's messages (its type) in its order.
    let mut mnext = alloc::vec![0u32; k as usize];
    let mut m = [0u8; 1000];
    for _ in 0..k as u32 * n {
        let (len, t) = f::msgrcv(q, &mut m, 0, false).map_err(e)?;
        let wr = (t - 1) as u8;
        ensure!(t >= 1 && wr < k, "message of type {t}");
        let seq = mnext[wr as usize];
        ensure!(m[..len] == record(wr, seq)[..], "queue: writer {wr} message {seq} differs");
        mnext[wr as usize] += 1;
    }
    for pid in kids {
        ensure!(reap(pid)? == 0, "writer {pid} failed");
    }
    println!("writers: {} writers, {} records each: the pipe and the queue delivered all of them whole and in order", k, n);
    Ok(())
}

/// The ring index of pipe descriptor `fd` (the raw call).
fn ring_index(fd: u32) -> usize {
    let mut c = Call { op: op::FDRING, a: [fd as u64, 0, 0, 0], ..Default::default() };
    wisp::hypercall::call(wisp::abi::Hypercall::Family, &mut c);
    c.ret as usize
}

fn page() -> &'static Rings {
    // The library OS has asked for the page by now (it was used); the
    // family's page is mapped at RINGS_GPA in every member.
    // SAFETY: mapped for the VM's life, atomics only.
    unsafe { &*(RINGS_GPA as *const Rings) }
}

pub(crate) fn corrupt() -> R {
    let (r, w) = f::pipe().map_err(e)?;
    let (kr, kw) = f::pipe().map_err(e)?;
    let q = f::msgget(0, f::IPC_CREAT).map_err(e)?;
    // Data the family has in flight before one member goes bad.
    f::write(kw, b"keep").map_err(e)?;
    f::msgsnd(q, 5, b"kept").map_err(e)?;
    let pid = f::fork().map_err(e)?;
    if pid == 0 {
        f::write(w, b"!").map_err(e)?; // the page is in use
        let rings = page();
        let p = &rings.pipes[ring_index(w)];
        // Positions that make no sense: this member's next call on it fails.
        p.tail.store(p.head.load(Ordering::SeqCst).wrapping_add(1_000_000), Ordering::SeqCst);
        ensure!(f::write(w, b"x") == Err(Errno::EIO), "a write on a corrupt ring did not fail with EIO");
        // A queue's bookkeeping written over: the same.
        let qr = &rings.queues[(q & 0xff) as usize];
        qr.count.store(9999, Ordering::SeqCst);
        ensure!(f::msgsnd(q, 1, b"x") == Err(Errno::EIO), "a send on a corrupt queue did not fail with EIO");
        // A lock left held by a pid no member has: taken over.
        p.lock.store(7777, Ordering::SeqCst);
        ensure!(f::write(w, b"ok") == Ok(2), "a write behind an abandoned lock failed");
        // And a lock this member takes and never gives back: it ends
        // holding it.
        let me = f::getpid();
        ensure!(p.lock.compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst).is_ok(), "lock busy");
        println!("corrupt: the corrupting member's own calls failed with EIO");
        wisp::exit(0);
    }
    ensure!(reap(pid)? == 0, "the corrupting child failed");
    let mut b = [0u8; 8];
    ensure!(f::read(r, &mut b).map_err(e)? == 2 && &b[..2] == b"ok", "the pipe lost what was written after the reset");
    f::write(w, b"after").map_err(e)?;
    ensure!(f::read(r, &mut b).map_err(e)? == 5 && &b[..5] == b"after", "the pipe does not work after the reset");
    ensure!(f::read(kr, &mut b).map_err(e)? == 4 && &b[..4] == b"keep", "another pipe lost its data");
    f::msgsnd(q, 1, b"q").map_err(e)?;
    let (n, t) = f::msgrcv(q, &mut b, 0, false).map_err(e)?;
    ensure!((n, t, b[0]) == (1, 1, b'q'), "the queue does not work after the reset");
    println!("corrupt: the family's pipes and queue work on");
    Ok(())
}
