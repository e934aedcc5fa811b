//! The format: a snapshot written, sealed and read back; each refusal.

use super::*;

fn temp(tag: &str) -> (std::path::PathBuf, File) {
    let p = std::env::temp_dir().join(format!("wisp-snap-{tag}-{}", std::process::id()));
    let f = File::options().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
    (p, f)
}

/// A snapshot of 16 MiB of RAM with two runs of pages (3 and 1 pages).
fn sample() -> (Snapshot, Vec<u8>) {
    let vcpu = Vcpu { regs: kvm_regs { rip: 0x10_1234, rsp: 0xf_f000, rflags: 2, ..Default::default() }, fpu: kvm_fpu { mxcsr: 0x1f80, ..Default::default() }, tsc: 12345, clock_ns: 99 };
    let dev = DeviceState { kind: 1, base: 0xff_0000, size: 0x1_0000, params: [1, 2, 3, 4, 5] };
    let pd = vec![0u64; 8];
    let snap = Snapshot::lay_out(16 << 20, 7, vcpu, vec![dev], vec![0u64; 512], pd, &[(0x1000, 0x1000), (0x10_0000, 0x3000)]);
    let mut file = snap.encode_head();
    for (k, r) in snap.runs.iter().enumerate() {
        file.extend((0..r.len).map(|i| (i as u8) ^ k as u8));
    }
    (snap, file)
}

fn written(tag: &str, bytes: &[u8]) -> (std::path::PathBuf, File) {
    let (p, f) = temp(tag);
    f.write_all_at(bytes, 0).unwrap();
    seal(&f).unwrap();
    (p, f)
}

#[test]
fn a_snapshot_reads_back_as_written() {
    let (snap, bytes) = sample();
    assert_eq!(snap.header.data_offset % PAGE_SIZE, 0);
    assert_eq!(snap.runs[0].offset, snap.header.data_offset);
    assert_eq!(snap.header.file_len, bytes.len() as u64);
    let (p, f) = written("ok", &bytes);
    let back = Snapshot::read(&f, true).unwrap();
    assert_eq!(back.runs, snap.runs);
    assert_eq!(back.devices, snap.devices);
    assert_eq!((back.vcpu.regs.rip, back.vcpu.fpu.mxcsr, back.vcpu.tsc, back.vcpu.clock_ns), (0x10_1234, 0x1f80, 12345, 99));
    assert_eq!((back.header.features, back.pd.len(), back.pt0.len()), (7, 8, 512));
    assert_ne!(back.header.digest, [0; 32]);
    let _ = std::fs::remove_file(p);
}

#[test]
fn every_damage_is_refused_with_what_it_is() {
    let (_, good) = sample();
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Damage, Error)> = vec![
        ("truncated", Box::new(|b: &mut Vec<u8>| b.truncate(b.len() - 100)), Error::Truncated { have: good.len() as u64 - 100, want: good.len() as u64 }),
        ("foreign", Box::new(|b: &mut Vec<u8>| b[..8].copy_from_slice(b"\x7fELF\x02\x01\x01\0")), Error::Foreign),
        ("version", Box::new(|b: &mut Vec<u8>| b[8..12].copy_from_slice(&3u32.to_le_bytes())), Error::Version { found: 3, want: VERSION }),
        ("flags", Box::new(|b: &mut Vec<u8>| b[88..92].copy_from_slice(&4u32.to_le_bytes())), Error::Malformed("unknown flags 0x4".into())),
        ("no base", Box::new(|b: &mut Vec<u8>| b[88..92].copy_from_slice(&1u32.to_le_bytes())), Error::Malformed("an incremental snapshot names its base, and only it".into())),
        ("abi", Box::new(|b: &mut Vec<u8>| b[12..16].copy_from_slice(&99u32.to_le_bytes())), Error::Abi { found: 99 }),
        ("memory", Box::new(|b: &mut Vec<u8>| b[16..24].copy_from_slice(&12345u64.to_le_bytes())), Error::Malformed("guest RAM of 12345 bytes is not a size a VM can have".into())),
        ("longer", Box::new(|b: &mut Vec<u8>| b.extend_from_slice(b"more")), Error::Malformed("4 bytes after its end".into())),
        ("altered page", Box::new(|b: &mut Vec<u8>| *b.last_mut().unwrap() ^= 1), Error::Digest),
    ];
    for (tag, damage, want) in cases {
        let mut bytes = good.clone();
        let (p, f) = temp(tag);
        f.write_all_at(&good, 0).unwrap();
        seal(&f).unwrap();
        f.read_exact_at(&mut bytes, 0).unwrap();
        damage(&mut bytes);
        f.set_len(0).unwrap();
        f.write_all_at(&bytes, 0).unwrap();
        assert_eq!(Snapshot::read(&f, true).unwrap_err(), want, "{tag}");
        let _ = std::fs::remove_file(p);
    }
    // An empty file, and one shorter than its magic.
    let (p, f) = temp("empty");
    assert_eq!(Snapshot::read(&f, true).unwrap_err(), Error::Truncated { have: 0, want: HEADER as u64 });
    f.write_all_at(b"WISP", 0).unwrap();
    assert!(matches!(Snapshot::read(&f, true).unwrap_err(), Error::Truncated { .. }));
    let _ = std::fs::remove_file(p);
}

#[test]
fn runs_must_be_in_order_inside_ram_and_off_the_monitors_pages() {
    let (snap, _) = sample();
    let bad = |runs: &[(u64, u64)]| {
        let s = Snapshot::lay_out(16 << 20, 0, snap.vcpu.clone(), Vec::new(), vec![0; 512], vec![0; 8], runs);
        let mut head = s.encode_head();
        head.resize(s.header.file_len as usize, 0);
        Snapshot::parse(&head, s.header.file_len).unwrap_err().to_string()
    };
    assert!(bad(&[(0x2000, 0x1000)]).contains("covers the monitor's own pages"));
    assert!(bad(&[(0x1000, 0x2000)]).contains("covers the monitor's own pages"));
    assert!(bad(&[(0x20_0000, 0x1000), (0x10_0000, 0x1000)]).contains("not page aligned, in order"));
    assert!(bad(&[(0xff_f000, 0x2000)]).contains("inside RAM"));
    assert!(bad(&[(0x10_0800, 0x1000)]).contains("page aligned"));
    assert!(bad(&[(0x10_0000, 0)]).contains("run 0"));
}

#[test]
fn a_stream_is_checked_as_it_comes_and_sealed() {
    let (snap, bytes) = sample();
    let (p, f) = temp("stream");
    let got = receive(&mut &bytes[..], &f, 1 << 30).unwrap();
    assert_eq!(got.runs, snap.runs);
    // What was written is a sealed snapshot.
    let back = Snapshot::read(&f, true).unwrap();
    assert_eq!(back.header.digest, got.header.digest);
    // Cut short, going on past its end, too big for this host, foreign.
    assert!(matches!(receive(&mut &bytes[..bytes.len() - 1], &f, 1 << 30), Err(Error::Truncated { .. })));
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(receive(&mut &longer[..], &f, 1 << 30).unwrap_err(), Error::Malformed("the stream goes on after the snapshot's end".into()));
    assert_eq!(receive(&mut &bytes[..], &f, 8 << 20).unwrap_err(), Error::Memory { want: 16, have: 8 });
    assert_eq!(receive(&mut &b"GIF89a.........................................................................................."[..], &f, 1 << 30).unwrap_err(), Error::Foreign);
    let _ = std::fs::remove_file(p);
}
