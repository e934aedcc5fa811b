//! `disk info | read OFFSET LEN | write OFFSET | sum | watch TICKS INTERVAL`:
//! the VM's first disk (`wisp run --volume FILE[:ro]`). `read` prints LEN
//! bytes at OFFSET (a whole sector) as they are; `write` writes standard
//! input (`wisp run -i`) at OFFSET, padded with zeros to whole 4 KiB
//! sectors, and flushes; `sum` prints the FNV-1a 64-bit hash of the whole
//! disk; `watch` reads the first sector once each INTERVAL, TICKS times,
//! and prints `disk: tick K first TEXT` (its text up to the first NUL or
//! newline: a VM snapshotted and restored part way reads its disk anew).
//! Offsets and lengths are whole sectors.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;
use alloc::vec::Vec;
use wisp::blk::Disk;

wisp::main!(main);

const CHUNK: usize = 1 << 20;

fn main() -> i32 {
    let Some(disk) = wisp::blk::disk() else {
        wisp::eprintln!("disk: no disk (run with --volume FILE[:ro])");
        return 1;
    };
    let num = |n: usize| wisp::env::arg(n).and_then(|a| a.parse::<u64>().ok());
    let r = match (wisp::env::arg(1), num(2), num(3)) {
        (Some("info"), _, _) => {
            let mode = if disk.read_only() { "read-only" } else { "read-write" };
            wisp::println!("disk: {} bytes, {}", disk.capacity(), mode);
            Ok(())
        }
        (Some("read"), Some(offset), Some(len)) => read(&disk, offset, len),
        (Some("write"), Some(offset), _) => write(&disk, offset),
        (Some("sum"), _, _) => sum(&disk),
        (Some("watch"), Some(ticks), _) => match wisp::env::arg(3).and_then(wisp::time::parse_duration) {
            Some(interval) => watch(&disk, ticks, interval),
            None => return usage(),
        },
        _ => return usage(),
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            wisp::eprintln!("disk: {}", e);
            1
        }
    }
}

fn usage() -> i32 {
    wisp::eprintln!("usage: disk info | read OFFSET LEN | write OFFSET | sum | watch TICKS INTERVAL");
    2
}

fn watch(disk: &Disk, ticks: u64, interval: core::time::Duration) -> Result<(), wisp::blk::Error> {
    let mut sector = vec![0u8; 4096];
    for k in 1..=ticks {
        disk.read(0, &mut sector)?;
        let end = sector.iter().position(|&b| b == 0 || b == b'\n').unwrap_or(sector.len());
        wisp::println!("disk: tick {} first {}", k, core::str::from_utf8(&sector[..end]).unwrap_or("(not UTF-8)"));
        wisp::time::sleep(interval);
    }
    Ok(())
}

fn read(disk: &Disk, offset: u64, len: u64) -> Result<(), wisp::blk::Error> {
    let mut buf = vec![0u8; (len as usize).min(CHUNK).next_multiple_of(4096)];
    let mut at = 0;
    while at < len {
        let n = ((len - at) as usize).min(CHUNK);
        // Whole sectors from the disk, the bytes asked for to the console.
        disk.read(offset + at, &mut buf[..n.next_multiple_of(4096)])?;
        wisp::console::write_bytes(&buf[..n]);
        at += n as u64;
    }
    Ok(())
}

fn write(disk: &Disk, offset: u64) -> Result<(), wisp::blk::Error> {
    let mut data = Vec::new();
    wisp::stdin::read_to_end(&mut data);
    let len = data.len();
    data.resize(len.next_multiple_of(4096).max(4096), 0);
    disk.write(offset, &data)?;
    disk.flush()?;
    wisp::println!("disk: wrote {} bytes at {}", len, offset);
    Ok(())
}

fn sum(disk: &Disk) -> Result<(), wisp::blk::Error> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0;
    while at < disk.capacity() {
        let n = ((disk.capacity() - at) as usize).min(CHUNK);
        disk.read(at, &mut buf[..n])?;
        for &b in &buf[..n] {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        at += n as u64;
    }
    wisp::println!("{:016x}", h);
    Ok(())
}
