//! `kvstore` speaks Redis' protocol (issue 18, item 5): Debian's own
//! `redis-cli` and `redis-benchmark` (redis-tools) drive a kvstore VM in a
//! network namespace the test makes, unchanged; bad input gets Redis'
//! answers and never takes the server down.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::netns::{Console, NetNs};

const IP: &str = "10.77.13.2";

fn cli(ns: &NetNs, args: &[&str]) -> String {
    let o = ns.cmd(&["redis-cli", "-h", IP, "-p", "6380"]).args(args).output().expect("redis-cli (apt install redis-tools)");
    assert!(o.status.success(), "redis-cli {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim_end_matches('\n').to_string()
}

/// Send `bytes` on a new connection and read until the server closes it
/// (or 5 s pass): what came back.
fn raw(ns: &NetNs, bytes: &[u8]) -> Vec<u8> {
    let script = format!(
        "{}\nimport sys\nc = connect('{IP}', 6380)\nc[0].sendall(sys.stdin.buffer.read())\nc[0].settimeout(5)\nout = b''\ntry:\n    while True:\n        d = c[0].recv(65536)\n        if not d: break\n        out += d\nexcept Exception:\n    out += b'<timeout>'\nsys.stdout.buffer.write(out)\n",
        common::PY_RESP
    );
    let mut child = ns.cmd(&["python3", "-c", &script]).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    assert!(child.wait().unwrap().success());
    out
}

#[test]
fn redis_cli_and_redis_benchmark_work_against_kvstore_unchanged() {
    let ns = NetNs::new("kvresp");
    ns.add_tap("wtap0", "10.77.13.1/24");
    let mut vm = ns.boot("wtap0", &format!("{IP}/24"), "kvstore", &["6380"]);
    let console = Console::of(&mut vm);
    console.wait_for(&format!("kvstore: listening on {IP}:6380"), Duration::from_secs(20));
    // A failing run shows what the VM said.
    struct Said<'a>(&'a Console);
    impl Drop for Said<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                eprintln!("the VM said: {:?}", self.0.rest(Duration::from_millis(100)));
            }
        }
    }
    let _said = Said(&console);

    // redis-cli, one command each (raw replies: nil is an empty line).
    assert_eq!(cli(&ns, &["PING"]), "PONG");
    assert_eq!(cli(&ns, &["SET", "a", "1"]), "OK");
    assert_eq!(cli(&ns, &["GET", "a"]), "1");
    assert_eq!(cli(&ns, &["INCR", "a"]), "2");
    assert_eq!(cli(&ns, &["INCRBY", "a", "40"]), "42");
    assert_eq!(cli(&ns, &["DECR", "a"]), "41");
    assert_eq!(cli(&ns, &["MSET", "x", "1", "y", "two words"]), "OK");
    assert_eq!(cli(&ns, &["--no-raw", "MGET", "x", "y", "nope"]), "1) \"1\"\n2) \"two words\"\n3) (nil)");
    assert_eq!(cli(&ns, &["EXISTS", "x", "y", "nope"]), "2");
    assert_eq!(cli(&ns, &["--no-raw", "SET", "x", "9", "NX"]), "(nil)");
    assert_eq!(cli(&ns, &["SET", "x", "9", "XX"]), "OK");
    assert_eq!(cli(&ns, &["DEL", "x", "nope"]), "1");
    assert_eq!(cli(&ns, &["--no-raw", "GET", "nope"]), "(nil)");
    assert_eq!(cli(&ns, &["DBSIZE"]), "2");
    assert_eq!(cli(&ns, &["INCR", "y"]), "ERR value is not an integer or out of range");
    assert_eq!(cli(&ns, &["NOPE", "z"]), "ERR unknown command 'NOPE'");
    assert_eq!(cli(&ns, &["GET"]), "ERR wrong number of arguments for 'get' command");
    assert!(cli(&ns, &["INFO", "keyspace"]).contains("db0:keys=2,"));
    // Values are bytes: a NUL, a newline, bytes that are not UTF-8.
    let o = ns.cmd(&["redis-cli", "-h", IP, "-p", "6380", "-x", "SET", "bin"]).stdin(std::process::Stdio::piped()).spawn().unwrap();
    let mut o = o;
    o.stdin.take().unwrap().write_all(b"a\0b\n\xff\xfe").unwrap();
    assert!(o.wait().unwrap().success());
    let got = ns.cmd(&["redis-cli", "-h", IP, "-p", "6380", "--raw", "GET", "bin"]).output().unwrap().stdout;
    assert_eq!(got, b"a\0b\n\xff\xfe\n");

    // redis-benchmark, plain and pipelined, with its 50 clients connecting
    // at once: every request answered.
    for pipeline in ["1", "16"] {
        let o = ns.cmd(&["timeout", "60", "redis-benchmark", "-h", IP, "-p", "6380", "-n", "5000", "-c", "50", "-P", pipeline, "-t", "set,get,incr,mset", "-q"]).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(o.status.success(), "{out} {}", String::from_utf8_lossy(&o.stderr));
        for t in ["SET", "GET", "INCR", "MSET (10 keys)"] {
            assert!(out.lines().any(|l| l.trim_start_matches('\r').rsplit('\r').next().unwrap_or("").starts_with(&format!("{t}: ")) && l.contains("requests per second")), "-P {pipeline}: no {t} in {out:?}");
        }
    }

    // Bad input: Redis' answers, the connection closed on a protocol
    // error, and the server serves on.
    let r = raw(&ns, b"*2\r\n$3\r\nGET\r\n:1\r\n");
    assert!(r.starts_with(b"-ERR Protocol error"), "{}", String::from_utf8_lossy(&r));
    let r = raw(&ns, b"*x\r\n");
    assert!(r.starts_with(b"-ERR Protocol error"), "{}", String::from_utf8_lossy(&r));
    let mut big = b"*2\r\n$3\r\nSET\r\n$9999999\r\n".to_vec();
    big.extend(std::iter::repeat_n(b'v', 1_100_000));
    let r = raw(&ns, &big);
    assert!(r.starts_with(b"-ERR Protocol error: too big request"), "{}", String::from_utf8_lossy(&r));
    // Inline commands, as Redis takes them, several in one write.
    let r = raw(&ns, b"PING\r\nSET k v\r\nGET k\r\nQUIT\r\n");
    assert_eq!(r, b"+PONG\r\n+OK\r\n$1\r\nv\r\n+OK\r\n");
    assert_eq!(cli(&ns, &["PING"]), "PONG");

    // BGSAVE: the fork's child writes the snapshot (as of the fork).
    assert_eq!(cli(&ns, &["BGSAVE"]), "Background saving started");
    let lines = console.wait_for("kvstore: snapshot end ", Duration::from_secs(20));
    let n = cli(&ns, &["DBSIZE"]);
    assert!(lines.iter().any(|l| *l == format!("kvstore: snapshot begin {n}")), "{lines:?}");
    let _ = vm.kill();
    let _ = vm.wait();
}

/// While BGSAVE's child saves (made slow here: it waits 5 s before it
/// writes), the parent serves on at once, and the snapshot is the data as
/// of the fork. (A parent with a live child parks on its family's bell,
/// not on its tap: its NIC's I/O thread, which had left the tap to the
/// earlier parks, once slept on, and the parent answered nothing until
/// the child ended — nor ever after, with the child left unreaped.)
#[test]
fn the_parent_serves_at_once_while_the_bgsave_child_saves() {
    let ns = NetNs::new("kvfork");
    ns.add_tap("wtap0", "10.77.13.1/24");
    let mut vm = ns.boot("wtap0", &format!("{IP}/24"), "kvstore", &["6380", "5000"]);
    let console = Console::of(&mut vm);
    console.wait_for(&format!("kvstore: listening on {IP}:6380"), Duration::from_secs(20));
    assert_eq!(cli(&ns, &["SET", "a", "1"]), "OK");
    assert_eq!(cli(&ns, &["BGSAVE"]), "Background saving started");
    let t = std::time::Instant::now();
    assert_eq!(cli(&ns, &["PING"]), "PONG");
    assert_eq!(cli(&ns, &["SET", "b", "2"]), "OK");
    assert_eq!(cli(&ns, &["DBSIZE"]), "2");
    assert!(cli(&ns, &["INFO", "persistence"]).contains("rdb_bgsave_in_progress:1"));
    let took = t.elapsed();
    assert!(took < Duration::from_secs(3), "four commands during the save took {took:?} (the child waits 5 s)");
    let lines = console.wait_for("kvstore: snapshot end ", Duration::from_secs(20));
    assert!(lines.iter().any(|l| l == "kvstore: snapshot begin 1"), "{lines:?}");
    assert!(!lines.iter().any(|l| l.starts_with("kvstore: snapshot b ")), "{lines:?}");
    // The child ended (reaped when the parent next looks): served on, the
    // save counted.
    assert_eq!(cli(&ns, &["PING"]), "PONG");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info = cli(&ns, &["INFO", "persistence"]);
        if info.contains("rdb_bgsave_in_progress:0") {
            assert!(info.contains("rdb_saves:1") && info.contains("rdb_last_bgsave_status:ok"), "{info}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the save never ended: {info}");
    }
    let _ = vm.kill();
    let _ = vm.wait();
}
