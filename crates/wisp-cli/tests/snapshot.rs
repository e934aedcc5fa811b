//! Snapshots through wispd on real KVM (`wisp snapshot`, `wisp restore`):
//! a counting VM saved part way is restored as new VMs that go on from its
//! count with their memory whole, the VM saved goes on (or stops with
//! --stop), a snapshot file is written with the client's rights, and a
//! damaged, foreign or missing snapshot is refused with one clear line.

mod common;

use std::os::unix::fs::{FileExt, PermissionsExt};
use std::time::Duration;

use common::daemon::Daemon;
use common::{console, eventually, wait_console};

/// The sum the counter prints after `ticks` ticks.
fn sum_after(ticks: u64) -> u64 {
    (0..ticks * 512).fold(0u64, |a, i| a.wrapping_add(i.wrapping_mul(i)))
}

fn out(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The first count a restored VM printed.
fn first_count(text: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix("count ")).and_then(|l| l.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no count in {text:?}"))
}

#[test]
fn a_vm_saved_through_the_daemon_goes_on_in_new_vms() {
    let d = Daemon::start("snapshot", &[]);
    let mut c = d.client();
    let o = d.wisp(&["run", "-d", "--name", "counter", "counter", "--", "60", "20ms"]);
    assert!(o.status.success(), "{}", out(&o));
    wait_console(&mut c, "counter", "count 5 ");
    let snap = d.dir.join("counter.snap");
    let o = d.wisp(&["snapshot", "counter", snap.to_str().unwrap()]);
    assert!(o.status.success(), "{}", out(&o));
    assert!(out(&o).contains("counter.snap: "), "{}", out(&o));
    // Written for its owner alone.
    assert_eq!(std::fs::metadata(&snap).unwrap().permissions().mode() & 0o777, 0o600);
    // The VM saved goes on to its end.
    let x = c.wait("counter").unwrap();
    assert_eq!(x.code, 0, "{}", x.reason);
    assert!(console(&mut c, "counter").contains(&format!("counter: done, sum {}", sum_after(60))));
    // Two VMs from it, one named: each goes on from the count it was
    // saved at, with its memory whole (the sums), to the same end.
    let a = d.wisp(&["restore", "--name", "again", snap.to_str().unwrap()]);
    assert!(a.status.success(), "{}", out(&a));
    let b = d.wisp(&["restore", snap.to_str().unwrap()]);
    assert!(b.status.success(), "{}", out(&b));
    for id in ["again".to_string(), String::from_utf8_lossy(&b.stdout).trim().to_string()] {
        let x = c.wait(&id).unwrap();
        assert_eq!(x.code, 0, "{id}: {}", x.reason);
        let text = console(&mut c, &id);
        let k = first_count(&text);
        assert!((5..60).contains(&k), "{id} restored at count {k}: {text}");
        assert!(text.contains(&format!("count {k} sum {}", sum_after(k))), "{text}");
        assert!(text.contains(&format!("counter: done, sum {}", sum_after(60))), "{text}");
    }
    assert_eq!(c.get("again").unwrap().image, snap.to_str().unwrap());
}

#[test]
fn stop_ends_the_vm_once_it_is_saved() {
    let d = Daemon::start("snapshot-stop", &[]);
    let mut c = d.client();
    let o = d.wisp(&["run", "-d", "--name", "c", "counter", "--", "100000", "50ms"]);
    assert!(o.status.success(), "{}", out(&o));
    wait_console(&mut c, "c", "count 2 ");
    let snap = d.dir.join("c.snap");
    let o = d.wisp(&["snapshot", "--stop", "c", snap.to_str().unwrap()]);
    assert!(o.status.success(), "{}", out(&o));
    let x = c.wait("c").unwrap();
    assert_ne!(x.code, 0, "stopped, not ended: {}", x.reason);
    // Its snapshot runs on.
    let o = d.wisp(&["restore", "--name", "c2", snap.to_str().unwrap()]);
    assert!(o.status.success(), "{}", out(&o));
    let n = first_count(&eventually(Duration::from_secs(10), || "no count from c2".into(), || Some(console(&mut c, "c2")).filter(|t| t.contains("count "))));
    assert!(n >= 2, "{n}");
    assert!(d.wisp(&["kill", "c2"]).status.success());
}

#[test]
fn bad_snapshots_and_paths_are_refused_with_one_line() {
    let d = Daemon::start("snapshot-bad", &[]);
    let mut c = d.client();
    let o = d.wisp(&["run", "-d", "--name", "c", "counter", "--", "100000", "50ms"]);
    assert!(o.status.success(), "{}", out(&o));
    wait_console(&mut c, "c", "count 1 ");
    let snap = d.dir.join("c.snap");
    assert!(d.wisp(&["snapshot", "c", snap.to_str().unwrap()]).status.success());
    let refused = |path: &std::path::Path| {
        let o = d.wisp(&["restore", path.to_str().unwrap()]);
        assert!(!o.status.success(), "restored {}", path.display());
        let text = out(&o);
        assert_eq!(text.trim().lines().count(), 1, "one line: {text}");
        text
    };
    // Missing, not a snapshot, cut short, altered.
    assert!(refused(&d.dir.join("none.snap")).contains("No such file"));
    let foreign = d.dir.join("foreign.snap");
    std::fs::write(&foreign, b"\x7fELF and more bytes than a header has ..........................................................................").unwrap();
    assert!(refused(&foreign).contains("not a wisp snapshot"));
    let bytes = std::fs::read(&snap).unwrap();
    let short = d.dir.join("short.snap");
    std::fs::write(&short, &bytes[..bytes.len() - 4096]).unwrap();
    assert!(refused(&short).contains("truncated"));
    let altered = d.dir.join("altered.snap");
    std::fs::write(&altered, &bytes).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&altered).unwrap();
    f.write_all_at(&[bytes[bytes.len() - 1] ^ 1], bytes.len() as u64 - 1).unwrap();
    assert!(refused(&altered).contains("digest mismatch"));
    // A snapshot into a directory that does not exist, or of a VM that is
    // not there.
    let o = d.wisp(&["snapshot", "c", "/nonexistent/dir/c.snap"]);
    assert!(!o.status.success() && out(&o).contains("No such file"), "{}", out(&o));
    let o = d.wisp(&["snapshot", "nosuchvm", d.dir.join("x.snap").to_str().unwrap()]);
    assert!(!o.status.success() && out(&o).contains("no such VM"), "{}", out(&o));
    // The VM saved is unharmed.
    assert!(c.get("c").unwrap().state == wisp_api::VmState::Running);
    assert!(d.wisp(&["kill", "c"]).status.success());
}

#[test]
fn a_snapshot_file_written_again_restores_its_new_contents() {
    // The daemon keeps checked snapshots by the file's identity: one
    // rewritten in place (new size or time) is read again.
    let d = Daemon::start("snapshot-again", &[]);
    let mut c = d.client();
    let o = d.wisp(&["run", "-d", "--name", "c", "counter", "--", "100000", "20ms"]);
    assert!(o.status.success(), "{}", out(&o));
    wait_console(&mut c, "c", "count 2 ");
    let snap = d.dir.join("c.snap");
    assert!(d.wisp(&["snapshot", "c", snap.to_str().unwrap()]).status.success());
    assert!(d.wisp(&["restore", "--name", "early", snap.to_str().unwrap()]).status.success());
    wait_console(&mut c, "c", "count 40 ");
    assert!(d.wisp(&["snapshot", "c", snap.to_str().unwrap()]).status.success());
    assert!(d.wisp(&["restore", "--name", "late", snap.to_str().unwrap()]).status.success());
    let mut first = |id: &str| first_count(&eventually(Duration::from_secs(10), || format!("no count from {id}"), || Some(console(&mut c, id)).filter(|t| t.contains("count "))));
    let early = first("early");
    let late = first("late");
    assert!(early < 40 && late >= 40, "restored at {early} and {late}");
    for vm in ["c", "early", "late"] {
        assert!(d.wisp(&["kill", vm]).status.success());
    }
}

#[test]
fn vms_start_from_a_template_where_its_guest_said_it_was_ready() {
    let d = Daemon::start("template", &[]);
    let mut c = d.client();
    let o = d.wisp(&["run", "--template", "ctr", "counter", "--", "5", "10ms"]);
    assert!(o.status.success(), "{}", out(&o));
    assert!(out(&o).starts_with("template ctr: "), "{}", out(&o));
    let listed = c.templates().unwrap();
    assert_eq!((listed.len(), listed[0].name.as_str(), listed[0].image.as_str()), (1, "ctr", "counter"));
    // Each VM from it counts from the start (the template was saved before
    // the first tick), with the template's arguments, to the same end.
    let want: String = (1..=5).map(|k| format!("count {k} sum {}\n", sum_after(k))).collect::<String>() + &format!("counter: done, sum {}\n", sum_after(5));
    for _ in 0..2 {
        let o = d.wisp(&["run", "--from", "ctr"]);
        assert!(o.status.success(), "{}", out(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout), want);
    }
    // The template's own VM exited once it was saved.
    assert_eq!(c.wait(&listed[0].vm).unwrap().code, 0);
    // An image that never says it is ready makes no template; nor does a
    // bad name; a template that is not there starts nothing.
    let o = d.wisp(&["run", "--template", "h", "hello"]);
    assert!(!o.status.success() && out(&o).contains("without saying it is ready"), "{}", out(&o));
    let o = d.wisp(&["run", "--template", "a/b", "counter"]);
    assert!(!o.status.success() && out(&o).contains("invalid name 'a/b'"), "{}", out(&o));
    let o = d.wisp(&["run", "--from", "nope"]);
    assert!(!o.status.success() && out(&o).contains("no such template: nope"), "{}", out(&o));
    let o = d.wisp(&["run", "--from", "ctr", "counter"]);
    assert!(!o.status.success() && out(&o).contains("give no IMAGE"), "{}", out(&o));
    c.remove_template("ctr").unwrap();
    assert!(c.templates().unwrap().is_empty());
    let o = d.wisp(&["run", "--from", "ctr"]);
    assert!(!o.status.success() && out(&o).contains("no such template: ctr"), "{}", out(&o));
}

#[test]
fn a_hundred_vms_from_one_template_share_its_pages() {
    let d = Daemon::start("template-many", &["--pool", "16M=4"]);
    let mut c = d.client();
    // Asleep between ticks a minute apart: the instances stay.
    assert!(d.wisp(&["run", "--template", "sleepy", "counter", "--", "1000", "60s"]).status.success());
    let o = d.wisp(&["run", "-d", "--count", "100", "--from", "sleepy"]);
    assert!(o.status.success(), "{}", out(&o));
    let vms: Vec<_> = c.list().unwrap().into_iter().filter(|v| v.image == "sleepy" && v.state == wisp_api::VmState::Running).collect();
    assert_eq!(vms.len(), 100);
    for v in &vms {
        wait_console(&mut c, &v.id, "count 1 ");
    }
    // The template's pages, mapped from one sealed memfd by every VMM
    // process: resident in each, but each one's proportional share is a
    // fraction of it.
    assert_shared(&vms.iter().map(|v| v.pid).collect::<Vec<_>>());
    let o = d.wisp(&["rm", "-f", "--all"]);
    assert!(o.status.success(), "{}", out(&o));
}

/// The pages of the snapshot memfd that the VMM processes `pids` map:
/// most resident ones are shared (not copied), and each process's
/// proportional share of them is a sliver.
fn assert_shared(pids: &[u32]) {
    let (mut rss, mut pss, mut private) = (0u64, 0u64, 0u64);
    for pid in pids {
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
        let mut in_snapshot = false;
        for line in smaps.lines() {
            // A mapping's header: "start-end perms offset dev inode [path]".
            let header = line.split_whitespace().next().is_some_and(|t| t.contains('-') && t.chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
            if header {
                in_snapshot = line.contains("/memfd:wisp-snapshot");
            } else if in_snapshot {
                let kb = |l: &str| l.split_whitespace().nth(1).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
                if line.starts_with("Rss:") {
                    rss += kb(line);
                } else if line.starts_with("Pss:") {
                    pss += kb(line);
                } else if line.starts_with("Private_") {
                    private += kb(line);
                }
            }
        }
    }
    // What each guest wrote is its own (copy-on-write); the rest, most of
    // the snapshot, is one copy: its proportional share is a sliver.
    let shared = rss - private;
    assert!(rss > 0 && shared > rss / 2, "most snapshot pages copied: {private} KiB private of {rss} KiB");
    assert!((pss - private) * 20 < shared, "snapshot pages not shared: Pss {pss} KiB, private {private} KiB, Rss {rss} KiB");
}

#[test]
fn the_same_snapshot_restored_a_hundred_times_at_once_shares_its_pages() {
    let d = Daemon::start("snapshot-many", &["--pool", "16M=4"]);
    let mut c = d.client();
    // Asleep between ticks a minute apart: the copies stay.
    assert!(d.wisp(&["run", "-d", "--name", "c", "counter", "--", "1000", "60s"]).status.success());
    wait_console(&mut c, "c", "count 1 ");
    let snap = d.dir.join("c.snap");
    assert!(d.wisp(&["snapshot", "--stop", "c", snap.to_str().unwrap()]).status.success());
    // A hundred restores of one file, from 20 clients at once.
    let path = snap.to_str().unwrap().to_string();
    let ids: Vec<String> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..20)
            .map(|_| {
                let (d, path) = (&d, &path);
                s.spawn(move || {
                    let mut c = d.client();
                    (0..5).map(|_| c.create(&wisp_api::CreateVm { image: "copy".into(), restore: Some(path.clone()), ..Default::default() }).map(|v| v.id)).collect::<Vec<_>>()
                })
            })
            .collect();
        threads.into_iter().flat_map(|t| t.join().unwrap()).map(|r| r.expect("restored")).collect()
    });
    assert_eq!(ids.len(), 100);
    let vms: Vec<_> = c.list().unwrap().into_iter().filter(|v| ids.contains(&v.id)).collect();
    assert!(vms.iter().all(|v| v.state == wisp_api::VmState::Running), "{vms:?}");
    assert_eq!(vms.len(), 100);
    let pids: Vec<u32> = vms.iter().map(|v| v.pid).collect();
    // One copy of the file, checked once: every VM maps the same memfd.
    let inodes: std::collections::HashSet<String> = pids
        .iter()
        .flat_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default().lines().filter(|l| l.contains("/memfd:wisp-snapshot")).filter_map(|l| l.split_whitespace().nth(4).map(str::to_string)).collect::<Vec<_>>())
        .collect();
    assert_eq!(inodes.len(), 1, "the snapshot copied more than once: memfds {inodes:?}");
    assert_shared(&pids);
    let o = d.wisp(&["rm", "-f", "--all"]);
    assert!(o.status.success(), "{}", out(&o));
}

#[test]
fn an_incremental_snapshot_restores_over_its_base() {
    let d = Daemon::start("snapshot-inc", &[]);
    let mut c = d.client();
    assert!(d.wisp(&["run", "-d", "--name", "c", "counter", "--", "100000", "20ms"]).status.success());
    wait_console(&mut c, "c", "count 2 ");
    let (base, inc) = (d.dir.join("base.snap"), d.dir.join("inc.snap"));
    // None to build on yet.
    let o = d.wisp(&["snapshot", "--incremental", "c", inc.to_str().unwrap()]);
    assert!(!o.status.success() && out(&o).contains("needs an earlier one"), "{}", out(&o));
    assert!(d.wisp(&["snapshot", "c", base.to_str().unwrap()]).status.success());
    wait_console(&mut c, "c", "count 30 ");
    let o = d.wisp(&["snapshot", "--incremental", "c", inc.to_str().unwrap()]);
    assert!(o.status.success(), "{}", out(&o));
    let (b, i) = (std::fs::metadata(&base).unwrap().len(), std::fs::metadata(&inc).unwrap().len());
    // Over its base: on from count 30 at least, the memory whole.
    let o = d.wisp(&["restore", "--name", "r", "--base", base.to_str().unwrap(), inc.to_str().unwrap()]);
    assert!(o.status.success(), "{}", out(&o));
    let text = eventually(Duration::from_secs(10), || "no count from r".into(), || Some(console(&mut c, "r")).filter(|t| t.contains("count ")));
    let k = first_count(&text);
    assert!(k >= 30, "restored at {k}: {text}");
    wait_console(&mut c, "r", &format!("count {} sum {}", k + 1, sum_after(k + 1)));
    // Alone it is refused, as is a chain in the wrong order.
    let o = d.wisp(&["restore", inc.to_str().unwrap()]);
    assert!(!o.status.success() && out(&o).contains("needs its base"), "{}", out(&o));
    let o = d.wisp(&["restore", "--base", inc.to_str().unwrap(), base.to_str().unwrap()]);
    assert!(!o.status.success() && out(&o).contains("needs its base"), "{} (base {b} B, increment {i} B)", out(&o));
    for vm in ["c", "r"] {
        assert!(d.wisp(&["kill", vm]).status.success());
    }
}

#[test]
fn a_vm_with_a_nic_is_restored_with_its_address_and_answers() {
    let d = Daemon::start_in_netns("snapshot-net", "10.77.21.0/24", &[]);
    let mut c = d.client();
    let vm = c.create(&wisp_api::CreateVm { image: "echo".into(), net: true, ..Default::default() }).unwrap();
    let ip = vm.ip.clone().expect("an address");
    wait_console(&mut c, &vm.id, "echo: listening");
    let echo = |word: &str| {
        d.python(&format!("import socket; s=socket.create_connection(('{ip}',7),timeout=5); s.sendall(b'{word}'); s.shutdown(socket.SHUT_WR); print(s.recv(100).decode())"))
    };
    assert_eq!(echo("before").trim(), "before");
    let snap = d.dir.join("echo.snap");
    let o = d.wisp(&["snapshot", "--stop", &vm.id, snap.to_str().unwrap()]);
    assert!(o.status.success(), "{}", out(&o));
    c.wait(&vm.id).unwrap();
    c.remove(&vm.id, true).unwrap();
    // Back with its address, answering on it.
    let o = d.wisp(&["restore", "--name", "again", snap.to_str().unwrap()]);
    assert!(o.status.success(), "{}", out(&o));
    let again = c.get("again").unwrap();
    assert_eq!(again.ip.as_deref(), Some(ip.as_str()));
    // It announced itself (a gratuitous ARP): before it sends anything
    // else, the bridge knows its MAC is behind its new tap.
    let mac = wisp_vmm::mac_for_ipv4(ip.parse::<std::net::Ipv4Addr>().unwrap().octets());
    let mac = mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
    let tap = format!("wt{}", again.id);
    eventually(Duration::from_secs(5), || format!("{mac} never learnt on {tap}"), || {
        let fdb = d.in_netns(&["bridge", "fdb", "show", "dev", &tap]).output().unwrap();
        String::from_utf8_lossy(&fdb.stdout).contains(&mac).then_some(())
    });
    assert_eq!(echo("after").trim(), "after");
    // While a VM has the address, another restore of it is refused.
    let o = d.wisp(&["restore", snap.to_str().unwrap()]);
    assert!(!o.status.success() && out(&o).contains(&format!("address {ip} is in use")), "{}", out(&o));
    assert!(d.wisp(&["rm", "-f", "--all"]).status.success());
}

#[test]
fn a_vm_with_a_disk_and_an_environment_is_restored_on_its_volume() {
    let d = Daemon::start("snapshot-disk", &[]);
    let mut c = d.client();
    // A volume whose first sector says "first".
    let vol = d.dir.join("vol.img");
    let f = std::fs::File::create(&vol).unwrap();
    f.set_len(64 << 10).unwrap();
    f.write_all_at(b"first\n", 0).unwrap();
    let v = vol.to_str().unwrap();
    let o = d.wisp(&["run", "-d", "--name", "w", "--volume", v, "-e", "GREETING=hi", "disk", "--", "watch", "100000", "20ms"]);
    assert!(o.status.success(), "{}", out(&o));
    wait_console(&mut c, "w", "disk: tick 3 first first");
    // Saved with its disk's ring held still, and its environment's region.
    let snap = d.dir.join("w.snap");
    let o = d.wisp(&["snapshot", "--stop", "w", snap.to_str().unwrap()]);
    assert!(o.status.success(), "{}", out(&o));
    c.wait("w").unwrap();
    let ticks = |text: &str| text.lines().filter_map(|l| l.strip_prefix("disk: tick ")).filter_map(|l| l.split(' ').next()?.parse::<u64>().ok()).collect::<Vec<_>>();
    let saved_at = *ticks(&console(&mut c, "w")).last().unwrap();
    c.remove("w", true).unwrap();
    // The disk's contents are not in the snapshot: the volume is given
    // again, as it was given (read-write); it changed meanwhile.
    f.write_all_at(b"second\n", 0).unwrap();
    let s = snap.to_str().unwrap();
    let o = d.wisp(&["restore", s]);
    assert!(!o.status.success() && out(&o).contains("its restore needs its volume"), "{}", out(&o));
    let o = d.wisp(&["restore", "--volume", &format!("{v}:ro"), s]);
    assert!(!o.status.success() && out(&o).contains("the saved disk was read-write"), "{}", out(&o));
    let o = d.wisp(&["restore", "--volume", v, "--volume", v, s]);
    assert!(!o.status.success() && out(&o).contains("more volumes"), "{}", out(&o));
    let o = d.wisp(&["restore", "--name", "w2", "--volume", v, s]);
    assert!(o.status.success(), "{}", out(&o));
    // On from its tick, reading the volume as it is now.
    wait_console(&mut c, "w2", "first second");
    let text = console(&mut c, "w2");
    let k = ticks(&text)[0];
    assert!(k > saved_at, "restored at tick {k}, saved at {saved_at}: {text}");
    assert!(!text.contains("first first"), "{text}");
    assert!(d.wisp(&["kill", "w2"]).status.success());
}
