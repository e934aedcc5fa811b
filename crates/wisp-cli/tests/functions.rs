//! The functions service (`wisp fn serve`; `docs/usecases.md`): calls of
//! registered functions over HTTP, each in a VM of its own under a real
//! wispd — an image booted fresh and removed after, or an application
//! library on a recycler scrubbed between calls; the per-call limits of
//! time, memory and output answered with their statuses; bad requests and
//! registrations refused with clear errors.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::Daemon;

/// `wisp fn serve` against daemon `d`, on a port of loopback the system
/// picks; its port. Killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(d: &Daemon, fns: &[&str]) -> Server {
        Server::start_with(d, fns, &[])
    }

    fn start_with(d: &Daemon, fns: &[&str], extra: &[&str]) -> Server {
        let mut args = vec!["fn".to_string(), "serve".into(), "--listen".into(), "127.0.0.1:0".into(), "--time-limit".into(), "5s".into()];
        args.extend(extra.iter().map(|a| a.to_string()));
        for f in fns {
            match f.strip_prefix("process:") {
                Some(p) => args.extend(["--process-fn".to_string(), p.to_string()]),
                None => args.extend(["--fn".to_string(), f.to_string()]),
            }
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_wisp"))
            .args(&args)
            .env("WISP_SOCKET", &d.socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("wisp fn serve said: {line}"));
        Server { child, port }
    }

    /// One request (its own connection): status, headers (lower-cased
    /// names), body.
    fn request(&self, method: &str, path: &str, body: &str) -> (u16, Vec<(String, String)>, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let mut lines = head.lines();
        let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
        let headers = lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
        (status, headers, body.to_string())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[test]
fn each_call_runs_in_a_vm_of_its_own_within_its_limits() {
    let d = Daemon::start("fn", &[]);
    let lib = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/libs/hello.so");
    let lib = std::fs::canonicalize(&lib).expect("make libs");
    let srv = Server::start(&d, &["hello=hello", &format!("lib={}", lib.display()), "process:echo=/bin/echo"]);

    // An image: a fresh VM per call, with the call's arguments, gone after.
    let (st, h, body) = srv.request("POST", "/functions/hello", r#"{"args":["a","b"]}"#);
    assert_eq!(st, 200, "{body}");
    assert!(body.contains(r#"args: ["a", "b"]"#), "{body}");
    assert_eq!(header(&h, "x-wisp-exit"), Some("0"));
    assert!(header(&h, "x-wisp-call-us").is_some_and(|v| v.parse::<u64>().is_ok()));
    assert!(d.client().list().unwrap().iter().all(|v| v.image != "hello"), "the call's VM is removed: {:?}", d.client().list());
    // A library: on a recycler scrubbed between calls (the recycler exits 3
    // when anything of a run before is left: a 500 here).
    for arg in ["first", "second", "third"] {
        let (st, _, body) = srv.request("POST", "/functions/lib", &format!(r#"{{"args":["{arg}"]}}"#));
        assert_eq!(st, 200, "{body}");
        assert!(body.contains(&format!(r#"args: ["{arg}"]"#)) && body.matches("args:").count() == 1, "{body}");
    }

    // The comparison the benchmark makes: a host process per call, same server.
    let (st, _, body) = srv.request("POST", "/functions/echo", r#"{"args":["no","vm"]}"#);
    assert_eq!((st, body.as_str()), (200, "no vm\n"));
    // ... which HTTP cannot register.
    let (st, _, body) = srv.request("PUT", "/functions/sh", r#"{"image":"/bin/sh","process":true}"#);
    assert_eq!(st, 400, "{body}");

    // The limits: time (a guest that spins), memory (one that allocates
    // without bound), output (one that prints 100 kB).
    let put = |name: &str, f: &str| {
        let (st, _, body) = srv.request("PUT", &format!("/functions/{name}"), f);
        assert_eq!(st, 201, "{body}");
    };
    put("spin", r#"{"image":"hostile","args":["spin"],"time_limit_ms":300}"#);
    put("oom", r#"{"image":"hostile","args":["oom"]}"#);
    put("big", r#"{"image":"hostile","args":["big-console"],"max_output":1000}"#);
    let t = Instant::now();
    let (st, _, body) = srv.request("POST", "/functions/spin", "");
    assert_eq!(st, 504, "{body}");
    assert!(body.contains("time limit of 300 ms") && t.elapsed() < Duration::from_secs(5), "{body} {:?}", t.elapsed());
    let (st, _, body) = srv.request("POST", "/functions/oom", "");
    assert_eq!(st, 507, "{body}");
    assert!(body.contains("ran out of its memory (16 MiB)"), "{body}");
    let (st, _, body) = srv.request("POST", "/functions/big", "");
    assert_eq!(st, 502, "{body}");
    assert!(body.contains("output limit of 1000 bytes"), "{body}");
    // A function that exits non-zero: its output, a 500 and its status.
    put("fails", r#"{"image":"hostile","args":["exit","7"]}"#);
    let (st, h, _) = srv.request("POST", "/functions/fails", "");
    assert_eq!((st, header(&h, "x-wisp-exit")), (500, Some("7")));
    // No call's VM is left.
    common::eventually(Duration::from_secs(10), || format!("{:?}", d.client().list()), || {
        d.client().list().unwrap().iter().all(|v| v.image != "hostile" && v.image != "hello").then_some(())
    });

    // Bad requests and registrations.
    let refused = |m: &str, p: &str, b: &str, status: u16, says: &str| {
        let (st, _, body) = srv.request(m, p, b);
        assert!(st == status && body.contains(says), "{m} {p} {b}: {st} {body}");
    };
    refused("POST", "/functions/nope", "", 404, "no such function: nope");
    refused("POST", "/functions/hello", "garbage", 400, "invalid JSON body");
    refused("POST", "/functions/hello", r#"{"argz":[]}"#, 400, "unknown field");
    refused("PUT", "/functions/bad%20name", r#"{"image":"hello"}"#, 400, "use 1-64 of");
    refused("PUT", "/functions/x", r#"{"image":"hello","time_limit_ms":0}"#, 400, "must be above 0");
    refused("PUT", "/functions/x", r#"{"image":"rel/lib.so"}"#, 400, "an absolute path is needed");
    refused("PUT", "/functions/x", r#"{"image":"/nonexistent/lib.so"}"#, 400, "/nonexistent/lib.so");
    refused("GET", "/other", "", 404, "no such endpoint");
    refused("PATCH", "/functions/hello", "", 405, "not allowed");
    let (st, _, _) = srv.request("DELETE", "/functions/hello", "");
    assert_eq!(st, 204);
    refused("POST", "/functions/hello", "", 404, "no such function: hello");
    let (st, _, body) = srv.request("GET", "/functions", "");
    assert!(st == 200 && body.contains("\"lib\"") && !body.contains("\"hello\""), "{body}");
}

#[test]
fn calls_past_the_running_limit_wait_their_turn() {
    let d = Daemon::start("fn-queue", &[]);
    let srv = std::sync::Arc::new(Server::start_with(&d, &["hello=hello"], &["--max-running", "1"]));
    let (st, _, body) = srv.request("PUT", "/functions/spin", r#"{"image":"hostile","args":["spin"],"time_limit_ms":1500}"#);
    assert_eq!(st, 201, "{body}");
    let s2 = srv.clone();
    let long_start = Instant::now();
    let long = std::thread::spawn(move || s2.request("POST", "/functions/spin", "").0);
    // Once the long call's VM runs, a second call waits for its place.
    common::eventually(Duration::from_secs(10), || "the spinning call's VM did not start".into(), || {
        d.client().list().unwrap().iter().any(|v| v.image == "hostile").then_some(())
    });
    let (st, _, body) = srv.request("POST", "/functions/hello", "");
    let short_done = long_start.elapsed();
    assert_eq!(st, 200, "{body}");
    assert_eq!(long.join().unwrap(), 504);
    // The spinning call runs its whole 1.5 s: the second could not run before.
    assert!(short_done >= Duration::from_millis(1500), "the second call was answered {short_done:?} after the first began");
}
