//! The modes of the `hostile` test images (`main.rs`: every feature;
//! `bin/hostile-lone.rs`: none, so that it cannot fork and a group VMM
//! process may hold it).

use core::arch::asm;
use core::hint::black_box;
use core::time::Duration;

use alloc::vec::Vec;
use wisp::abi::{args, Hypercall};

#[path = "net_offload.rs"]
mod net_offload;

pub fn main() -> i32 {
    let mode = wisp::env::arg(1).unwrap_or("");
    let mem = wisp::env::mem_size();
    if mode == "late-line" {
        return late_line();
    }
    // No exit at all, not even a line: the monitor must still answer the
    // start (its first-exit timer) and stop the VM when asked.
    if mode == "spin-quiet" {
        loop {
            core::hint::spin_loop();
        }
    }
    wisp::println!("hostile: {}", mode);
    // SAFETY (all asm below): deliberately invalid operations; the monitor
    // must stop the VM. None of them returns normally.
    match mode {
        "spin" => loop {
            core::hint::spin_loop();
        },
        "write-outside-ram" => unsafe { core::ptr::write_volatile((mem + 0x1000) as *mut u64, 1) },
        "write-null" => unsafe { core::ptr::write_volatile(8 as *mut u64, 1) },
        "write-page-tables" => unsafe { core::ptr::write_volatile(0x6000 as *mut u64, 0) },
        "write-boot-info" => unsafe { core::ptr::write_volatile(0x1000 as *mut u64, 0) },
        "write-code" => unsafe { core::ptr::write_volatile(main as *const () as *mut u8, 0xcc) },
        "wild-write" => unsafe { core::ptr::write_volatile(0x8000_0000_0000_0000u64 as *mut u64, 1) },
        "exec-stack" => {
            let code = [0xc3u8; 16];
            let f: extern "C" fn() = unsafe { core::mem::transmute(code.as_ptr()) };
            f();
        }
        "hlt" => unsafe { asm!("hlt") },
        "cli" => unsafe { asm!("cli") },
        "write-cr3" => unsafe { asm!("xor eax, eax", "mov cr3, rax", out("rax") _) },
        "ud2" => unsafe { asm!("ud2") },
        "div0" => {
            let z = black_box(0u32);
            unsafe { asm!("div {0:e}", in(reg) z, inout("eax") 1u32 => _, inout("edx") 0u32 => _) };
        }
        "int3" => unsafe { asm!("int3") },
        "port-io" => unsafe { asm!("out 0x80, al", in("al") 0u8) },
        // A doorbell of a device the VM does not have (no device 7), and the
        // first port past the doorbells.
        "doorbell-nodev" => unsafe { asm!("out dx, al", in("dx") 0x607u16, in("al") 0u8) },
        "port-past-doorbells" => unsafe { asm!("out dx, al", in("dx") 0x608u16, in("al") 0u8) },
        "port-in" => unsafe { asm!("in al, dx", in("dx") 0x500u16, out("al") _) },
        "stack-overflow" => {
            recurse(0);
        }
        "console-oob" => {
            let mut a = args::ConsoleWrite { data: mem - 8, len: 64, ret: 0 };
            wisp::hypercall::call(Hypercall::ConsoleWrite, &mut a);
        }
        "disk-bad-ring" | "disk-into-code" => return disk_abuse(mode),
        "stdin-into-boot-info" => {
            let mut a = args::Stdio { op: args::stdio_op::READ_IN, reserved: 0, data: 0x1000, len: 64, ret: 0 };
            wisp::hypercall::call(Hypercall::Stdio, &mut a);
        }
        "stderr-oob" => {
            let mut a = args::Stdio { op: args::stdio_op::WRITE_ERR, reserved: 0, data: mem - 8, len: 64, ret: 0 };
            wisp::hypercall::call(Hypercall::Stdio, &mut a);
        }
        "stdio-bad-op" => {
            let mut a = args::Stdio { op: 9, reserved: 0, data: 0x10_0000, len: 1, ret: 0 };
            wisp::hypercall::call(Hypercall::Stdio, &mut a);
        }
        "console-huge-len" => {
            let mut a = args::ConsoleWrite { data: 0x10_0000, len: u64::MAX, ret: 0 };
            wisp::hypercall::call(Hypercall::ConsoleWrite, &mut a);
        }
        "console-wrap" => {
            let mut a = args::ConsoleWrite { data: u64::MAX - 4, len: 16, ret: 0 };
            wisp::hypercall::call(Hypercall::ConsoleWrite, &mut a);
        }
        "args-oob" => unsafe {
            asm!("out dx, eax", in("dx") Hypercall::ConsoleWrite.port(), in("eax") 0xffff_fff0u32);
        },
        "unknown-hypercall" => unsafe {
            // The last port of the hypercall window a 4-byte `out` may use
            // (its 4 ports inside the window): no hypercall there.
            asm!("out dx, eax", in("dx") wisp::abi::HYPERCALL_PORT_BASE + wisp::abi::HYPERCALL_PORT_COUNT - 4, in("eax") 0u32);
        },
        "family-oob" => unsafe {
            asm!("out dx, eax", in("dx") Hypercall::Family.port(), in("eax") 0xffff_fff0u32);
        },
        "fork-oob" => unsafe {
            asm!("out dx, eax", in("dx") Hypercall::Fork.port(), in("eax") 0xffff_fff0u32);
        },
        "family-abuse" => return family_abuse(mem),
        "monitor-pages" => monitor_pages(),
        "clock-into-stubs" => {
            // SAFETY: only the address is passed; the monitor must refuse it.
            unsafe { asm!("out dx, eax", in("dx") Hypercall::Clock.port(), in("eax") 0x4000u32) };
        }
        "idle-into-page-tables" => unsafe {
            asm!("out dx, eax", in("dx") Hypercall::Idle.port(), in("eax") 0x6000u32);
        },
        "library-into-page-tables" => unsafe {
            asm!("out dx, eax", in("dx") Hypercall::Library.port(), in("eax") 0x6000u32);
        },
        "console-from-gdt" => {
            let mut a = args::ConsoleWrite { data: 0x2000, len: 64, ret: 0 };
            wisp::hypercall::call(Hypercall::ConsoleWrite, &mut a);
        }
        "console-block-in-code" => unsafe {
            // The block is read-only code: its `ret` must not be written.
            asm!("out dx, eax", in("dx") Hypercall::ConsoleWrite.port(), in("eax") main as *const () as usize as u32);
        },
        "byte-hypercall" => unsafe {
            asm!("out dx, al", in("dx") Hypercall::Exit.port(), in("al") 0u8);
        },
        // Well-behaved modes.
        "exit" => return wisp::env::arg(2).and_then(|s| s.parse().ok()).unwrap_or(0),
        "panic" => panic!("deliberate panic"),
        "oom" => {
            let mut v: Vec<Vec<u8>> = Vec::new();
            loop {
                v.push(Vec::with_capacity(1 << 20));
            }
        }
        "big-console" => {
            let line = [b'x'; 100_000];
            wisp::console::write_bytes(&line);
            wisp::println!();
            return 0;
        }
        "timers" => return timers(),
        "net-corrupt" => return net_corrupt(),
        "net-spoof" => return net_spoof(),
        "net-offload" => return net_offload::bad_frame(wisp::env::arg(2).unwrap_or("")),
        "net-rx-stall" => return net_offload::rx_stall(wisp::env::arg(2).and_then(|s| s.parse().ok()).unwrap_or(5)),
        "clock" => {
            let (mono, wall) = wisp::hypercall::clock();
            let mine = wisp::time::wall_ns();
            wisp::println!("clock: host mono {} wall {} guest wall {}", mono, wall, mine);
            let skew_ms = (mine as i128 - wall as i128).abs() / 1_000_000;
            wisp::println!("clock: skew {} ms", skew_ms);
            return 0;
        }
        _ => {
            wisp::println!("unknown mode '{}'", mode);
            return 2;
        }
    }
    wisp::println!("hostile: survived '{}'?!", mode);
    3
}

#[inline(never)]
#[allow(unconditional_recursion)]
fn recurse(n: u64) -> u64 {
    let buf = black_box([n; 64]);
    recurse(buf[7] + 1) + buf[3]
}

/// Many tasks waiting on timers: they must complete in deadline order and
/// the executor must batch waits (fewer idle calls than timers).
fn timers() -> i32 {
    use alloc::rc::Rc;
    use core::cell::RefCell;
    const N: u64 = 50;
    let order = Rc::new(RefCell::new(Vec::new()));
    for i in 0..N {
        let order = order.clone();
        // Deadlines 10..60 ms, in a scrambled order, several sharing one.
        let ms = 10 + (i * 37 % N) / 5 * 5;
        wisp::exec::spawn(async move {
            wisp::exec::sleep(Duration::from_millis(ms)).await;
            order.borrow_mut().push(ms);
        });
    }
    wisp::exec::run();
    let order = order.borrow();
    let sorted = order.windows(2).all(|w| w[0] <= w[1]);
    let idles = wisp::exec::idle_count();
    wisp::println!("timers: {} fired, in order: {}, idle calls: {}", order.len(), sorted, idles);
    if order.len() as u64 == N && sorted && idles < N {
        0
    } else {
        1
    }
}

/// Send raw frames that claim another identity (another source MAC, an
/// ARP reply for the gateway's address, another source IPv4 address, an
/// IPv6 frame), one good frame, then rewind the monitor's TX consumer
/// index to have the good frame sent again, and a last "DONE" frame. A
/// sniffer on the host side of the tap must see the good frame once and
/// none of the others.
fn net_spoof() -> i32 {
    use core::sync::atomic::{AtomicU32, Ordering};
    use wisp::abi::net::{decode_ipv4, decode_mac, hdr, SlotDesc, DESC_SIZE, SLOTS, SLOT_SIZE, TX_BUF_OFF, TX_DESC_OFF};
    let info = wisp::env::boot_info();
    let Some((idx, dev)) =
        info.devices[..info.device_count as usize].iter().enumerate().find(|(_, d)| d.kind == wisp::abi::DeviceKind::Net as u32)
    else {
        wisp::println!("net-spoof: no NIC");
        return 2;
    };
    let (mac, (ip, _)) = (decode_mac(dev.params[0]), decode_ipv4(dev.params[1]));
    let gw = decode_ipv4(dev.params[2]).0;
    // SAFETY: the header page of the NIC region is guest RAM shared with the
    // monitor; u32 fields at 4-byte aligned offsets.
    let field = |off: u64| unsafe { &*((dev.base + off) as *const AtomicU32) };
    let send = |frame: &[u8]| {
        let prod = field(hdr::TX_PROD).load(Ordering::Acquire);
        let slot = (prod % SLOTS) as u64;
        // SAFETY: slot `slot` of the TX ring belongs to the guest until it
        // publishes it by bumping TX_PROD below; the frame fits a slot.
        unsafe {
            core::ptr::copy_nonoverlapping(frame.as_ptr(), (dev.base + TX_BUF_OFF + slot * SLOT_SIZE as u64) as *mut u8, frame.len());
            let d = SlotDesc { len: frame.len() as u32, ..Default::default() };
            core::ptr::write_volatile((dev.base + TX_DESC_OFF + slot * DESC_SIZE) as *mut SlotDesc, d);
        }
        field(hdr::TX_PROD).store(prod.wrapping_add(1), Ordering::Release);
        wisp::hypercall::notify(idx as u32);
        // Wait until the monitor took it.
        let start = wisp::time::Instant::now();
        while field(hdr::TX_CONS).load(Ordering::Acquire) != prod.wrapping_add(1) && start.elapsed() < Duration::from_secs(5) {
            core::hint::spin_loop();
        }
    };
    let udp = |src_mac: [u8; 6], src_ip: [u8; 4], tag: &[u8]| -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&[0xff; 6]);
        f.extend_from_slice(&src_mac);
        f.extend_from_slice(&[0x08, 0x00]);
        let total = (20 + 8 + tag.len()) as u16;
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
        f.extend_from_slice(&src_ip);
        f.extend_from_slice(&gw);
        f.extend_from_slice(&[0x27, 0x0f, 0x27, 0x0f]); // ports 9999 -> 9999
        f.extend_from_slice(&(8 + tag.len() as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(tag);
        f
    };
    let mut other = mac;
    other[5] ^= 0x55;
    send(&udp(other, ip, b"SPOOF-MAC"));
    let mut arp = Vec::new();
    arp.extend_from_slice(&[0xff; 6]);
    arp.extend_from_slice(&mac);
    arp.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 2]);
    arp.extend_from_slice(&mac);
    arp.extend_from_slice(&gw); // "the gateway is at my MAC"
    arp.extend_from_slice(&[0xff; 6]);
    arp.extend_from_slice(&gw);
    send(&arp);
    let mut forged = ip;
    forged[3] = forged[3].wrapping_add(75);
    send(&udp(mac, forged, b"SPOOF-IP"));
    let mut v6 = Vec::new();
    v6.extend_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
    v6.extend_from_slice(&mac);
    v6.extend_from_slice(&[0x86, 0xdd]);
    v6.extend_from_slice(b"SPOOF-V6 padding to a plausible length......");
    send(&v6);
    send(&udp(mac, ip, b"GOOD"));
    // Rewind the monitor's consumer index: the good frame must not go again.
    let cons = field(hdr::TX_CONS).load(Ordering::Acquire);
    field(hdr::TX_CONS).store(cons.wrapping_sub(1), Ordering::Release);
    wisp::hypercall::notify(idx as u32);
    send(&udp(mac, ip, b"DONE"));
    wisp::println!("net-spoof: sent");
    0
}

/// Break the NIC's ring rules (a TX producer index far ahead of the
/// consumer, then kick): the monitor must stop the NIC, and only the NIC.
fn net_corrupt() -> i32 {
    use core::sync::atomic::{AtomicU32, Ordering};
    use wisp::abi::net::hdr;
    let info = wisp::env::boot_info();
    let Some(dev) = info.devices[..info.device_count as usize].iter().find(|d| d.kind == wisp::abi::DeviceKind::Net as u32) else {
        wisp::println!("net-corrupt: no NIC");
        return 2;
    };
    // SAFETY: the header page of the NIC region is guest RAM shared with the
    // monitor; u32 fields at 4-byte aligned offsets.
    let field = |off: u64| unsafe { &*((dev.base + off) as *const AtomicU32) };
    let cons = field(hdr::TX_CONS).load(Ordering::Acquire);
    field(hdr::TX_PROD).store(cons.wrapping_add(1000), Ordering::Release);
    let mut a = wisp::abi::args::Notify { device: 0, reserved: 0 };
    wisp::hypercall::call(Hypercall::Notify, &mut a);
    let start = wisp::time::Instant::now();
    while field(hdr::STOPPED).load(Ordering::Acquire) == 0 && start.elapsed() < Duration::from_secs(5) {
        wisp::time::sleep(Duration::from_millis(10));
    }
    let stopped = field(hdr::STOPPED).load(Ordering::Acquire);
    wisp::println!("net-corrupt: nic stopped = {}, guest still running", stopped);
    if stopped == 1 { 0 } else { 1 }
}

/// Have the monitor move IPC data into or out of the pages the guest may
/// not touch itself (exception stubs, page tables, IDT, GDT, boot info,
/// code): each must fail with `EFAULT`. Then `ud2`: the exception stubs
/// still report it (the VM stops with "invalid opcode"), so nothing ran at
/// CPL 0 but the monitor's own code.
fn monitor_pages() {
    use wisp::abi::errno::EFAULT;
    use wisp::abi::family::{flags, op, Call};
    let call = |o: u32, fl: u32, a: [u64; 4]| {
        let mut c = Call { op: o, flags: fl, a, ..Default::default() };
        wisp::hypercall::call(Hypercall::Family, &mut c);
        c.ret
    };
    let (r, w) = wisp::family::pipe().unwrap();
    let payload = [0xccu8; 256];
    let q = call(op::MSGGET, 0, [0, flags::IPC_CREAT, 0, 0]) as u64;
    let code = main as *const () as usize as u64 & !0xfff;
    let mut bad = 0;
    let targets: &[(&str, u64)] =
        &[("exception stubs", 0x4000), ("page tables", 0x6000), ("boot info", 0x1000), ("IDT", 0x3000), ("code", code)];
    for (what, at) in targets {
        // Data waiting in the pipe and the queue, so only the buffer check can fail.
        wisp::family::write(w, &payload).unwrap();
        call(op::MSGSND, 0, [q, payload.as_ptr() as u64, 64, 1]);
        let read = call(op::READ, flags::NOWAIT, [r as u64, *at, 256, 0]);
        let rcv = call(op::MSGRCV, flags::NOWAIT, [q, *at, 64, 0]);
        for (how, got) in [("read", read), ("msgrcv", rcv)] {
            if got != EFAULT {
                wisp::println!("monitor-pages: {} into the {}: got {}, want EFAULT", how, what, got);
                bad += 1;
            }
        }
        // Drain what the refused calls left.
        let mut sink = [0u8; 256];
        let _ = wisp::family::read_nowait(r, &mut sink);
        call(op::MSGRCV, flags::NOWAIT, [q, sink.as_mut_ptr() as u64, 64, 0]);
    }
    // Out of the monitor's pages: a pipe write whose data is the GDT.
    let got = call(op::WRITE, flags::NOWAIT, [w as u64, 0x2000, 64, 0]);
    if got != EFAULT {
        wisp::println!("monitor-pages: write from the GDT: got {}, want EFAULT", got);
        bad += 1;
    }
    wisp::println!("monitor-pages: {} cases, {} wrong", targets.len() * 2 + 1, bad);
    // SAFETY: deliberately invalid; the monitor's stub reports it.
    unsafe { asm!("ud2") };
}

/// Family calls with bad operands: each must fail with its errno, and the
/// VM goes on.
fn family_abuse(mem: u64) -> i32 {
    use wisp::abi::errno::*;
    use wisp::abi::family::{flags, op, Call};
    let call = |o: u32, fl: u32, a: [u64; 4]| {
        let mut c = Call { op: o, flags: fl, a, ..Default::default() };
        wisp::hypercall::call(Hypercall::Family, &mut c);
        c.ret
    };
    let (r, _) = wisp::family::pipe().unwrap();
    let cases: &[(&str, i64, i64)] = &[
        ("unknown op", call(99, 0, [0; 4]), ENOSYS),
        ("close of no descriptor", call(op::CLOSE, 0, [9999, 0, 0, 0]), EBADF),
        ("read of a closed descriptor", call(op::READ, 0, [63, 0x20_0000, 16, 0]), EBADF),
        ("read into memory outside RAM", call(op::READ, 0, [r as u64, mem - 8, 64, 0]), EFAULT),
        ("read into a wrapping buffer", call(op::READ, 0, [r as u64, u64::MAX - 4, 64, 0]), EFAULT),
        ("write to the read end", call(op::WRITE, flags::NOWAIT, [r as u64, 0x20_0000, 4, 0]), EBADF),
        ("signal 200", call(op::KILL, 0, [1, 200, 0, 0]), EINVAL),
        // Pid 1 is this VM (the family's root); 2 is the host's kthreadd,
        // which a family pid never names.
        ("kill a host process", call(op::KILL, 0, [2, 15, 0, 0]), ESRCH),
        ("kill a pid beyond any", call(op::KILL, 0, [1 << 40, 15, 0, 0]), ESRCH),
        ("wait without children", call(op::WAIT, 0, [u64::MAX, 0, 0, 0]), ECHILD),
        ("oversized message", call(op::MSGSND, 0, [0, 0x20_0000, 100_000, 1]), EINVAL),
        ("receive from no queue", call(op::MSGRCV, flags::NOWAIT, [12345, 0x20_0000, 16, 0]), EINVAL),
        ("attach no segment", call(op::SHMAT, 0, [77, 0, 0, 0]), EINVAL),
        ("detach nothing", call(op::SHMDT, 0, [0x1_0000_0000, 0, 0, 0]), EINVAL),
        ("empty segment", call(op::SHMGET, 0, [0, flags::IPC_CREAT, 0, 0]), EINVAL),
        ("huge segment", call(op::SHMGET, 0, [0, flags::IPC_CREAT, 1 << 40, 0]), EINVAL),
    ];
    let mut bad = 0;
    for (what, got, want) in cases {
        if got != want {
            wisp::println!("family-abuse: {}: got {}, want {}", what, got, want);
            bad += 1;
        }
    }
    wisp::println!("family-abuse: {} cases, {} wrong", cases.len(), bad);
    if bad == 0 { 0 } else { 1 }
}

/// `late-line [MS]`: a first console line that comes late and in two
/// pieces — "late-line: " at once, its end MS ms (default 300) later —
/// then parks until stopped (tests of `POST /v1/vms?wait_line=true`).
fn late_line() -> i32 {
    let ms = wisp::env::arg(2).and_then(|s| s.parse().ok()).unwrap_or(300);
    wisp::print!("late-line: ");
    wisp::time::sleep(Duration::from_millis(ms));
    wisp::println!("after {} ms", ms);
    loop {
        wisp::time::sleep(Duration::from_secs(3600));
    }
}

/// Break the disk's ring rules as a guest could: run the request index
/// far ahead, or ask for a read into the image's read-only code. The
/// monitor stops the disk (its `stopped` flag); the VM goes on, says so
/// and exits 0.
fn disk_abuse(mode: &str) -> i32 {
    use core::sync::atomic::{AtomicU32, Ordering};
    use wisp::abi::blk::{hdr, BlkReq, REQ_OFF};
    let info = wisp::env::boot_info();
    let Some((i, d)) = info.devices.iter().enumerate().take(info.device_count as usize).find(|(_, d)| d.kind == wisp::abi::DeviceKind::Block as u32) else {
        wisp::println!("{}: no disk", mode);
        return 1;
    };
    // SAFETY: the disk's header is guest RAM reserved for it; atomics as
    // the monitor shares it.
    let field = |off: u64| unsafe { &*((d.base + off) as *const AtomicU32) };
    if mode == "disk-bad-ring" {
        field(hdr::REQ_PROD).store(1000, Ordering::Release);
    } else {
        let code = disk_abuse as *const () as u64 & !0xfff;
        let r = BlkReq { op: wisp::abi::blk::op::READ, tag: 7, offset: 0, addr: code, len: 4096, reserved: 0 };
        // SAFETY: slot 0 of the disk's request ring, in its region.
        unsafe { core::ptr::write_volatile((d.base + REQ_OFF) as *mut BlkReq, r) };
        field(hdr::REQ_PROD).store(1, Ordering::Release);
    }
    wisp::hypercall::doorbell(i as u32);
    let deadline = wisp::time::uptime() + Duration::from_secs(10);
    while field(hdr::STOPPED).load(Ordering::Acquire) == 0 && wisp::time::uptime() < deadline {
        wisp::time::sleep(Duration::from_millis(1));
    }
    let stopped = field(hdr::STOPPED).load(Ordering::Acquire) != 0;
    wisp::println!("{}: disk {}, the VM runs on", mode, if stopped { "stopped" } else { "still there" });
    if stopped { 0 } else { 1 }
}
