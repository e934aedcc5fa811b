//! Disks (`wisp run --volume FILE[:ro]`, `wisp::blk`) on real KVM with the
//! bundled `disk` app: reads and writes that reach the host file, a
//! read-only volume shared by several VMs at once, malformed volumes, and
//! guests that break the ring rules (they lose the disk, not the VM).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{fresh_dir, images, wisp, wisp_input, Run};

fn volume(dir: &Path, name: &str, bytes: &[u8], size: u64) -> PathBuf {
    let p = dir.join(name);
    let mut data = bytes.to_vec();
    data.resize(size as usize, 0);
    std::fs::write(&p, data).unwrap();
    p
}

fn fnv(data: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}\n")
}

fn with_input(args: &[&str], input: &str) -> Run {
    wisp_input(args, &[] as &[(&str, &str)], Some(input.as_bytes().to_vec()), Duration::from_secs(30))
}

#[test]
fn reads_and_writes_reach_the_volume() {
    let dir = fresh_dir("vol-rw");
    let v = volume(&dir, "v.img", b"first sector\n", 4 << 20);
    let vs = v.to_str().unwrap();
    let r = wisp(&["run", "--volume", vs, "disk", "--", "info"]);
    assert_eq!((r.code, r.stdout.as_str()), (Some(0), "disk: 4194304 bytes, read-write\n"), "{}", r.stderr);
    let r = wisp(&["run", "--volume", vs, "disk", "--", "read", "0", "13"]);
    assert_eq!(r.stdout, "first sector\n", "{}", r.stderr);
    // Written by the guest: on the host's file, at its offset, and read back.
    let r = with_input(&["run", "-i", "--volume", vs, "disk", "--", "write", "8192"], "from the guest");
    assert_eq!((r.code, r.stdout.as_str()), (Some(0), "disk: wrote 14 bytes at 8192\n"), "{}", r.stderr);
    let host = std::fs::read(&v).unwrap();
    assert_eq!(&host[8192..8192 + 14], b"from the guest");
    assert_eq!(&host[8192 + 14..12288], &[0u8; 4096 - 14][..], "padded with zeros");
    let r = wisp(&["run", "--volume", vs, "disk", "--", "read", "8192", "14"]);
    assert_eq!(r.stdout, "from the guest");
    // The whole disk through the rings (4 MiB: requests of 1 MiB).
    let r = wisp(&["run", "--volume", vs, "disk", "--", "sum"]);
    assert_eq!(r.stdout, fnv(&host), "{}", r.stderr);
    // Misaligned and out of range: errors for the guest, the disk goes on.
    let r = wisp(&["run", "--volume", vs, "disk", "--", "read", "100", "10"]);
    assert!(r.code == Some(1) && r.stderr.contains("whole 4 KiB sectors"), "{}", r.stderr);
    let r = wisp(&["run", "--volume", vs, "disk", "--", "read", "4194304", "4096"]);
    assert!(r.code == Some(1) && r.stderr.contains("beyond the end of the disk"), "{}", r.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_read_only_volume_is_shared_by_many_vms_and_never_written() {
    let dir = fresh_dir("vol-ro");
    let content: Vec<u8> = (0..(2u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    let v = volume(&dir, "shared.img", &content, 2 << 20);
    let ro = format!("{}:ro", v.display());
    let r = wisp(&["run", "--volume", &ro, "disk", "--", "info"]);
    assert_eq!(r.stdout, "disk: 2097152 bytes, read-only\n");
    let r = with_input(&["run", "-i", "--volume", &ro, "disk", "--", "write", "0"], "overwrite");
    assert!(r.code == Some(1) && r.stderr.contains("the disk is read-only"), "{}", r.stderr);
    // Four VMs read the whole volume at once.
    let kids: Vec<_> = (0..4)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_wisp"))
                .args(["run", "--timeout", "30s", "--volume", &ro, "disk", "--", "sum"])
                .env("WISP_IMAGE_DIR", images())
                .env("WISP_SOCKET", "/nonexistent/wisp-test.sock")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for k in kids {
        let o = k.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(String::from_utf8_lossy(&o.stdout), fnv(&content));
    }
    assert_eq!(std::fs::read(&v).unwrap(), content, "a read-only volume changed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn malformed_volumes_are_refused_with_one_line() {
    let dir = fresh_dir("vol-bad");
    let odd = volume(&dir, "odd.img", b"", 1000);
    let r = wisp(&["run", "--volume", odd.to_str().unwrap(), "disk", "--", "info"]);
    assert_eq!(r.code, Some(125));
    assert!(r.stderr.contains("is 1000 bytes: a volume is a whole number of 4096-byte sectors"), "{}", r.stderr);
    let empty = volume(&dir, "empty.img", b"", 0);
    let r = wisp(&["run", "--volume", empty.to_str().unwrap(), "disk", "--", "info"]);
    assert!(r.code == Some(125) && r.stderr.contains("is 0 bytes"), "{}", r.stderr);
    let r = wisp(&["run", "--volume", "/nonexistent/v.img", "disk", "--", "info"]);
    assert!(r.code == Some(125) && r.stderr.contains("volume /nonexistent/v.img: No such file"), "{}", r.stderr);
    let r = wisp(&["run", "--volume", ":ro", "disk"]);
    assert!(r.code == Some(2) && r.stderr.contains("expected FILE[:ro]"), "{}", r.stderr);
    // Without a volume the app says how to give one.
    let r = wisp(&["run", "disk", "--", "info"]);
    assert!(r.code == Some(1) && r.stderr.contains("run with --volume"), "{}", r.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_guest_that_breaks_the_ring_rules_loses_only_its_disk() {
    let dir = fresh_dir("vol-hostile");
    let v = volume(&dir, "v.img", b"", 1 << 20);
    let before = std::fs::read(&v).unwrap();
    for (mode, why) in [
        ("disk-bad-ring", "wisp: disk stopped: request index 1000 ran 1000 ahead of the 0 taken (at most 128)"),
        ("disk-into-code", "is not in memory the guest may write"),
    ] {
        let r = wisp(&["run", "--volume", v.to_str().unwrap(), "hostile", "--", mode]);
        assert_eq!(r.code, Some(0), "{mode}: {}", r.stderr);
        assert!(r.stdout.contains(&format!("{mode}: disk stopped, the VM runs on")), "{mode}: {}", r.stdout);
        assert!(r.stderr.contains(why), "{mode}: {}", r.stderr);
    }
    assert_eq!(std::fs::read(&v).unwrap(), before, "the volume changed");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `wisp ARGS` against `socket`, as user 65534 in group 4242 (the API
/// group of the daemon), with `input` on its stdin if any.
fn as_client(socket: &Path, args: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new(env!("CARGO_BIN_EXE_wisp"))
        .args(args)
        .env("WISP_SOCKET", socket)
        .uid(65534)
        .gid(4242)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn through_wispd_volumes_are_opened_with_the_clients_rights() {
    use std::os::unix::fs::PermissionsExt;
    let dir = fresh_dir("vol-daemon");
    let d = common::daemon::Daemon::start("vol-daemon", &["--socket-group", "4242"]);
    let via = |args: &[&str], input: Option<&str>| {
        wisp_input(args, &[("WISP_SOCKET", &d.socket)], input.map(|s| s.as_bytes().to_vec()), Duration::from_secs(30))
    };
    // As root: written through the daemon's VMM process, read back.
    let v = volume(&dir, "v.img", b"", 1 << 20);
    let vs = v.to_str().unwrap();
    let r = via(&["run", "-i", "--volume", vs, "disk", "--", "write", "4096"], Some("through wispd"));
    assert_eq!((r.code, r.stdout.as_str()), (Some(0), "disk: wrote 13 bytes at 4096\n"), "{}", r.stderr);
    assert_eq!(&std::fs::read(&v).unwrap()[4096..4096 + 13], b"through wispd");
    let r = via(&["run", "--volume", &format!("{vs}:ro"), "disk", "--", "read", "4096", "13"], None);
    assert_eq!(r.stdout, "through wispd", "{}", r.stderr);
    // As another user: what that user may open, as that user may open it.
    let public = volume(&dir, "public.img", b"public", 1 << 20);
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).unwrap();
    let private = volume(&dir, "private.img", b"secret", 1 << 20);
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let hidden_dir = dir.join("root-only");
    std::fs::create_dir(&hidden_dir).unwrap();
    let hidden = volume(&hidden_dir, "h.img", b"hidden", 1 << 20);
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&hidden_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let ro = |p: &Path| format!("{}:ro", p.display());
    let o = as_client(&d.socket, &["run", "--volume", &ro(&public), "disk", "--", "read", "0", "6"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "public");
    for (vol, what) in [
        (public.display().to_string(), "public, read-write"),
        (ro(&private), "another user's file"),
        (ro(&hidden), "a file in a directory the client cannot search"),
    ] {
        let o = as_client(&d.socket, &["run", "--volume", &vol, "disk", "--", "info"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{what}: {err}");
        assert!(err.contains("Permission denied") && err.contains("uid 65534"), "{what}: {err}");
    }
    assert_eq!(&std::fs::read(&public).unwrap()[..6], b"public");
    // The API refuses what cannot be a volume.
    let mut c = d.client();
    let rel = wisp_api::CreateVm { image: "disk".into(), volumes: vec![wisp_api::Volume { path: "v.img".into(), read_only: true }], ..Default::default() };
    let r = c.create(&rel);
    assert!(matches!(r, Err(wisp_api::client::ApiError::Status(400, ref m)) if m.contains("not an absolute path")), "{r:?}");
    let odd = volume(&dir, "odd.img", b"", 5000);
    let bad = wisp_api::CreateVm { image: "disk".into(), volumes: vec![wisp_api::Volume { path: odd.display().to_string(), read_only: true }], ..Default::default() };
    let r = c.create(&bad);
    assert!(matches!(r, Err(wisp_api::client::ApiError::Status(400, ref m)) if m.contains("whole number of 4096-byte sectors")), "{r:?}");
    let _ = std::fs::set_permissions(&hidden_dir, std::fs::Permissions::from_mode(0o755));
    let _ = std::fs::remove_dir_all(&dir);
}
