//! `wisp shfs`: volumes made, filled, listed, emptied and checked on the
//! host; corrupt and truncated volumes refused with one line; a tool
//! killed between writing an object and committing it leaves the volume
//! as it was.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{fresh_dir, wisp, Run};
use sha2::{Digest, Sha256};

fn sha(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

fn shfs(args: &[&str]) -> Run {
    let mut all = vec!["shfs"];
    all.extend_from_slice(args);
    wisp(&all)
}

fn mkfs(dir: &Path, objects: &str) -> PathBuf {
    let v = dir.join("cache.img");
    let r = shfs(&["mkfs", v.to_str().unwrap(), "--size", "8M", "--chunk", "4K", "--objects", objects, "--label", "t"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    v
}

fn file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

#[test]
fn a_volume_is_made_filled_listed_emptied_and_checked() {
    let dir = fresh_dir("shfs-life");
    let v = mkfs(&dir, "256");
    let vs = v.to_str().unwrap();
    let page = b"<h1>hello</h1>\n".to_vec();
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    let p = file(&dir, "index.html", &page);
    let b = file(&dir, "clip.mp4", &big);
    let r = shfs(&["add", vs, p.to_str().unwrap(), "--name", "/index.html"]);
    assert_eq!((r.code, r.stdout.trim()), (Some(0), sha(&page).as_str()), "{}", r.stderr);
    let r = shfs(&["add", vs, b.to_str().unwrap()]);
    assert_eq!(r.stdout.trim(), sha(&big));
    let r = shfs(&["add", vs, "--link", "http://origin:8080/live.m3u8", "--name", "/live.m3u8", "--mime", "application/vnd.apple.mpegurl"]);
    assert_eq!(r.stdout.trim(), sha(b"http://origin:8080/live.m3u8"), "{}", r.stderr);
    let ls = shfs(&["ls", vs]).stdout;
    assert!(ls.contains(&format!("{} file         15 text/html /index.html", sha(&page))), "{ls}");
    assert!(ls.contains(&format!("{} file     100000 video/mp4", sha(&big))), "{ls}");
    assert!(ls.contains("link          0 application/vnd.apple.mpegurl /live.m3u8 http://origin:8080/live.m3u8"), "{ls}");
    let info = shfs(&["info", vs]).stdout;
    assert!(info.contains("objects:  3 (2 files, 1 links)") && info.contains("data:     26 of"), "{info}");
    // The bytes are on the volume where its entry says (fsck reads them
    // back against their digests).
    let r = shfs(&["fsck", vs]);
    assert_eq!((r.code, r.stdout.trim()), (Some(0), format!("fsck: {vs}: 3 objects, clean").as_str()));
    // Refused: the same name twice; the same content again is no new object.
    let r = shfs(&["add", vs, b.to_str().unwrap(), "--name", "/index.html"]);
    assert!(r.code == Some(125) && r.stderr.contains("named '/index.html' already"), "{}", r.stderr);
    let r = shfs(&["add", vs, p.to_str().unwrap()]);
    assert!(r.code == Some(0) && r.stderr.contains("there already"), "{}", r.stderr);
    // Removed by name and by digest; their chunks are free again.
    assert_eq!(shfs(&["rm", vs, "/index.html"]).code, Some(0));
    assert_eq!(shfs(&["rm", vs, &sha(&big)]).code, Some(0));
    let r = shfs(&["rm", vs, "/nope"]);
    assert!(r.code == Some(125) && r.stderr.contains("no object '/nope'"), "{}", r.stderr);
    assert!(shfs(&["info", vs]).stdout.contains("objects:  1 (0 files, 1 links)"));
    assert!(shfs(&["info", vs]).stdout.contains("data:     0 of"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn corrupt_and_truncated_volumes_are_refused_with_one_line() {
    let dir = fresh_dir("shfs-bad");
    let v = mkfs(&dir, "64");
    let vs = v.to_str().unwrap();
    let data = b"some object".to_vec();
    shfs(&["add", vs, file(&dir, "o.txt", &data).to_str().unwrap()]);
    let good = std::fs::read(&v).unwrap();
    let refused = |bytes: &[u8], needle: &str| {
        std::fs::write(&v, bytes).unwrap();
        let r = shfs(&["ls", vs]);
        assert_eq!(r.code, Some(125), "{needle}: {}", r.stdout);
        assert!(r.stderr.contains(needle) && r.stderr.lines().count() == 1, "{needle}: {}", r.stderr);
    };
    let mut b = good.clone();
    b[20] ^= 1;
    refused(&b, "the superblock's checksum does not match");
    refused(&good[..good.len() - 4096], "the volume is truncated");
    refused(&vec![0u8; 1 << 20], "not an SHFS volume");
    // An entry damaged: refused at mount; fsck says which.
    let slot = good[4096..].chunks(512).position(|e| e.iter().any(|&x| x != 0)).unwrap();
    let mut b = good.clone();
    b[4096 + slot * 512 + 40] ^= 1;
    refused(&b, &format!("table entry {slot}: its checksum does not match"));
    let r = shfs(&["fsck", vs]);
    assert!(r.code == Some(1) && r.stdout.contains(&format!("table entry {slot}")), "{}", r.stdout);
    // Contents damaged: the table is fine, fsck finds it.
    std::fs::write(&v, &good).unwrap();
    let at = good.len() - good.iter().rev().position(|&x| x != 0).unwrap() - 1;
    let mut b = good.clone();
    b[at] ^= 0xff;
    std::fs::write(&v, &b).unwrap();
    assert_eq!(shfs(&["ls", vs]).code, Some(0));
    let r = shfs(&["fsck", vs]);
    assert!(r.code == Some(1) && r.stdout.contains("its contents do not match its digest"), "{}", r.stdout);
    // Bad geometry at mkfs.
    let r = shfs(&["mkfs", vs, "--size", "8M", "--chunk", "5K"]);
    assert!(r.code == Some(125) && r.stderr.contains("not a whole number") || r.stderr.contains("power of two"), "{}", r.stderr);
    let r = shfs(&["mkfs", vs, "--size", "8"]);
    assert!(r.code == Some(2) && r.stderr.contains("has no unit"), "{}", r.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_bucket_is_a_clear_error() {
    let dir = fresh_dir("shfs-full");
    let v = mkfs(&dir, "8"); // one bucket of 8
    let vs = v.to_str().unwrap();
    for i in 0..8 {
        let r = shfs(&["add", vs, file(&dir, &format!("f{i}"), format!("object {i}").as_bytes()).to_str().unwrap()]);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
    }
    let r = shfs(&["add", vs, file(&dir, "f8", b"one more").to_str().unwrap()]);
    assert!(r.code == Some(125) && r.stderr.contains("bucket for this digest is full"), "{}", r.stderr);
    assert_eq!(shfs(&["fsck", vs]).code, Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tool_killed_before_its_commit_leaves_the_volume_as_it_was() {
    let dir = fresh_dir("shfs-crash");
    let v = mkfs(&dir, "256");
    let vs = v.to_str().unwrap();
    let first = b"an object already there".to_vec();
    shfs(&["add", vs, file(&dir, "first", &first).to_str().unwrap(), "--name", "first"]);
    let before = shfs(&["ls", vs]).stdout;
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 31 % 255) as u8).collect();
    let bf = file(&dir, "big", &big);
    // Stopped between the contents and the entry, then killed.
    let mut child = Command::new(env!("CARGO_BIN_EXE_wisp"))
        .args(["shfs", "add", vs, bf.to_str().unwrap()])
        .env("WISP_SHFS_STOP_BEFORE_COMMIT", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stat = format!("/proc/{}/stat", child.id());
    let t = Instant::now();
    while !std::fs::read_to_string(&stat).is_ok_and(|s| s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('T'))) {
        assert!(t.elapsed() < Duration::from_secs(20), "the tool never reached its commit");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // The contents were written (the volume's data area is no longer empty)...
    let raw = std::fs::read(&v).unwrap();
    assert!(raw.windows(64).any(|w| w == &big[1000..1064]), "the tool had not written the contents yet");
    // ...and nothing references them: the volume is as it was, and clean.
    assert_eq!(shfs(&["ls", vs]).stdout, before);
    assert_eq!(shfs(&["fsck", vs]).code, Some(0));
    // The same add, uninterrupted, works.
    let r = shfs(&["add", vs, bf.to_str().unwrap()]);
    assert_eq!((r.code, r.stdout.trim()), (Some(0), sha(&big).as_str()));
    assert_eq!(shfs(&["fsck", vs]).code, Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}
