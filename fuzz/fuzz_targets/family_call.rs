//! The family call block and the family IPC behind it: the input is a run of `family::Call` blocks
//! as the guest writes them (read with zerocopy, which must give the same bytes back), each run
//! against a real family (pipes, message queues, shared memory, wait, signals) the way the vCPU
//! loop does, but never blocking (a waiter that is always interrupted). Also the ABI's pure decoders
//! (wait statuses, hypercall ports, IPv4/MAC parameters). The guest-RAM copies around these calls
//! are the monitor's and not public: data comes from the input and reads go to a scratch buffer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wisp_abi::family::{flags, limits, op, signal, status, Call};
use wisp_abi::net::{decode_ipv4, decode_mac, encode_ipv4, encode_mac};
use wisp_abi::Hypercall;
use wisp_vmm::family::{Family, Waiter};
use wisp_vmm::FamilyOptions;
use zerocopy::{FromBytes, IntoBytes};

const CALL: usize = core::mem::size_of::<Call>();

fn decoders(c: &Call) {
    let s = c.a[0];
    match (status::exit_code(s), status::term_signal(s)) {
        (Some(code), None) => assert_eq!(status::exit_code(status::exited(code)), Some(code)),
        (None, Some(sig)) => assert_eq!(status::term_signal(status::signaled(sig)), Some(sig)),
        other => panic!("status {s:#x} decodes to {other:?}"),
    }
    let port = c.a[1] as u16;
    if let Some(h) = Hypercall::from_port(port) {
        assert_eq!(h.port(), port);
        let _ = (h.name(), h.feature());
    }
    let (addr, prefix) = decode_ipv4(c.a[2]);
    assert_eq!(encode_ipv4(addr, prefix), c.a[2] & 0xff_ffff_ffff);
    let mac = decode_mac(c.a[3]);
    assert_eq!(encode_mac(mac), c.a[3] & 0xffff_ffff_ffff);
}

fuzz_target!(|data: &[u8]| {
    let Ok(mut fam) = Family::new_root(FamilyOptions::default()) else { return };
    let (interrupted, hold) = (|| true, || ());
    let w = Waiter { interrupted: &interrupted, hold: &hold };
    let mut out = Vec::new();
    let mut chunks = data.chunks_exact(CALL);
    for (n, chunk) in chunks.by_ref().enumerate() {
        if n >= 64 {
            break;
        }
        let mut c = Call::read_from_bytes(chunk).expect("a whole block");
        assert_eq!(c.as_bytes(), chunk, "the block round-trips");
        decoders(&c);
        let nowait = c.flags & flags::NOWAIT != 0;
        // Bytes a WRITE/MSGSND would copy from guest RAM: taken from the block itself, repeated.
        let len = (c.a[2] as usize).min(2 * limits::MSG_MAX);
        let payload: Vec<u8> = chunk.iter().copied().cycle().take(len).collect();
        out.clear();
        let r = match c.op {
            op::GETPID => fam.getpid(),
            op::PIPE => fam.pipe(),
            op::CLOSE => fam.close(c.a[0]),
            op::READ => fam.read(c.a[0], len, nowait, &w, &mut out),
            op::WRITE => fam.write(c.a[0], &payload, nowait, &w),
            // Only this process is a member: a SIGKILL would kick our own thread, so no kick signal.
            op::KILL => fam.kill(c.a[0] as i64, c.a[1], 0),
            op::WAIT => fam.wait(c.a[0] as i64, nowait, &w),
            op::MSGGET => fam.msgget(c.a[0] as i64, c.a[1]),
            op::MSGSND => fam.msgsnd(c.a[0], &payload, c.a[3] as i64, nowait, &w),
            op::MSGRCV => fam.msgrcv(c.a[0], len, c.a[3] as i64, c.flags, &w, &mut out),
            op::MSGRMID => fam.msgrmid(c.a[0]),
            op::SHMGET => fam.shmget(c.a[0] as i64, c.a[2] & 0xff_ffff, c.a[1]),
            op::SHMAT => fam.shmat(c.a[0], &mut |_, _, _, _| true),
            op::SHMDT => fam.shmdt(c.a[0], &mut |_, _| ()),
            op::SHMRMID => fam.shmrmid(c.a[0]),
            op::SIGNALS => Ok((0, fam.take_signals())),
            op::PAUSE => fam.pause(&w),
            _ => Err(wisp_abi::errno::ENOSYS),
        };
        match r {
            Ok((ret, ret2)) => {
                assert!(ret >= 0, "op {} returned {ret}", c.op);
                if matches!(c.op, op::READ | op::MSGRCV) {
                    assert!(out.len() <= len, "op {} gave {} bytes for a {len}-byte buffer", c.op, out.len());
                    assert_eq!(ret as usize, out.len());
                }
                c.ret = ret;
                c.ret2 = ret2;
            }
            Err(e) => {
                assert!(e < 0 && e >= -4095, "op {} errno {e}", c.op);
                c.ret = e;
            }
        }
        c.signals = fam.take_signals();
        // Signal n is bit n, and there are none above signal::MAX.
        assert!(signal::MAX == 63 || c.signals >> (signal::MAX + 1) == 0);
    }
    let _ = chunks.remainder();
    fam.exit(status::exited(0));
});
