//! Tests of the HTTP server and client: parsing, limits, streaming, malformed input.

use super::client::{framing, read_body, read_response_head};
use super::common::bad;
use super::*;
use std::io::{self, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::net::UnixListener;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

fn parse(bytes: &[u8]) -> Result<Option<Request>, HttpError> {
    read_request(&mut &bytes[..])
}

fn status_of(bytes: &[u8]) -> u16 {
    match parse(bytes) {
        Err(e) => e.status,
        Ok(r) => panic!("expected an error for {:?}, got {r:?}", String::from_utf8_lossy(bytes)),
    }
}

/// Serve requests on `s` until EOF, an error, or `handler` returns false;
/// yields the number of requests served.
fn serve<F>(s: UnixStream, mut handler: F) -> thread::JoinHandle<usize>
where
    F: FnMut(&Request, &mut UnixStream) -> bool + Send + 'static,
{
    thread::spawn(move || {
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        let mut n = 0;
        loop {
            match read_request(&mut r) {
                Ok(Some(req)) => {
                    n += 1;
                    if !handler(&req, &mut w) || !req.keep_alive() {
                        return n;
                    }
                }
                Ok(None) => return n,
                Err(e) => {
                    let _ = write_error(&mut w, e.status, &e.message, false);
                    return n;
                }
            }
        }
    })
}

#[test]
fn json_round_trip_and_keep_alive() {
    let (a, b) = UnixStream::pair().unwrap();
    let srv = serve(b, |req, w| {
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/v1/vms") => {
                let v: serde_json::Value = req.json().unwrap();
                write_json(w, 201, &serde_json::json!({ "echo": v, "ct": req.header("Content-Type") }), true)
            }
            _ => write_error(w, 404, &format!("no route for {}", req.path), true),
        }
        .unwrap();
        true
    });
    let mut c = Client::from_stream(a);
    let r = c.request_json("POST", "/v1/vms", &serde_json::json!({ "image": "hello" })).unwrap();
    assert_eq!(r.status, 201);
    let v: serde_json::Value = r.json().unwrap();
    assert_eq!(v["echo"]["image"], "hello");
    assert_eq!(v["ct"], "application/json");
    let r = c.request("GET", "/nope", None).unwrap();
    assert_eq!((r.status, r.error_message().as_str()), (404, "no route for /nope"));
    assert_eq!(r.json::<crate::ErrorBody>().unwrap().error, "no route for /nope");
    drop(c);
    assert_eq!(srv.join().unwrap(), 2, "both requests on one connection");
}

#[test]
fn chunked_streaming_is_incremental() {
    let (a, b) = UnixStream::pair().unwrap();
    let (tx, rx) = mpsc::channel::<()>();
    let srv = serve(b, move |req, w| {
        if req.path == "/after" {
            write_response(w, 204, "text/plain", b"ignored", true).unwrap();
            return true;
        }
        start_chunked(w, 200, "text/plain").unwrap();
        for i in 0..3 {
            write_chunk(w, format!("line {i}\n").as_bytes()).unwrap();
            write_chunk(w, b"").unwrap();
            // The next chunk is only sent once the client has seen this one.
            rx.recv_timeout(Duration::from_secs(10)).expect("chunk not delivered incrementally");
        }
        end_chunked(w).unwrap();
        true
    });
    let mut c = Client::from_stream(a);
    let mut got = Vec::new();
    let status = c
        .stream("GET", "/v1/vms/x/logs?follow=1", None, &mut |d| {
            got.extend_from_slice(d);
            tx.send(()).is_ok()
        })
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(got, b"line 0\nline 1\nline 2\n");
    // The connection is still usable after the chunked body.
    let r = c.request("GET", "/after", None).unwrap();
    assert_eq!((r.status, r.body.len()), (204, 0));
    drop(c);
    assert_eq!(srv.join().unwrap(), 2);
}

#[test]
fn stream_error_is_kept_not_streamed() {
    let (a, b) = UnixStream::pair().unwrap();
    let srv = serve(b, |_, w| write_error(w, 404, "no such VM", true).is_ok());
    let mut c = Client::from_stream(a);
    let status = c.stream("GET", "/logs", None, &mut |_| panic!("error body streamed")).unwrap();
    assert_eq!(status, 404);
    assert_eq!(c.take_error().unwrap().error_message(), "no such VM");
    drop(c);
    srv.join().unwrap();
}

#[test]
fn connect_reconnect_and_stale_retry() {
    let dir = std::env::temp_dir().join(format!("wisp-http-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("api.sock");
    let _ = std::fs::remove_file(&sock);
    let l = UnixListener::bind(&sock).unwrap();
    let srv = thread::spawn(move || {
        for _ in 0..4 {
            let (s, _) = l.accept().unwrap();
            // Claims keep-alive but closes: the client must retry once.
            serve(s, |req, w| {
                write_response(w, 200, "text/plain", req.path.as_bytes(), true).unwrap();
                false
            })
            .join()
            .unwrap();
        }
    });
    let mut c = Client::connect(&sock).unwrap();
    for p in ["/one", "/two", "/three"] {
        let r = c.request("GET", p, None).unwrap();
        assert_eq!(r.body, p.as_bytes());
    }
    let mut calls = 0;
    assert_eq!(
        c.stream("GET", "/stop", None, &mut |_| {
            calls += 1;
            false
        })
        .unwrap(),
        200
    );
    assert_eq!(calls, 1);
    srv.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn query_and_percent_decoding() {
    let req =
        parse(b"GET /v1/vms/a%20b%2Fc?name=hello+world%21&flag&&x=%E2%9C%93 HTTP/1.1\r\n\r\n").unwrap().unwrap();
    assert_eq!(req.path, "/v1/vms/a b/c");
    assert_eq!(req.query_param("name"), Some("hello world!"));
    assert_eq!(req.query_param("flag"), Some(""));
    assert_eq!(req.query_param("x"), Some("✓"));
    assert_eq!(req.query.len(), 3);
    let name = "a b/c?&=+ü";
    assert_eq!(percent_decode(&percent_encode(name), true).unwrap(), name);
    // And through a real connection.
    let (a, b) = UnixStream::pair().unwrap();
    let srv = serve(b, |req, w| {
        let v = serde_json::json!({ "path": req.path, "q": req.query_param("q") });
        write_json(w, 200, &v, true).is_ok()
    });
    let mut c = Client::from_stream(a);
    let target = format!("/v1/vms/{}?q={}", percent_encode(name), percent_encode(name));
    let v: serde_json::Value = c.request("GET", &target, None).unwrap().json().unwrap();
    assert_eq!((v["path"].as_str(), v["q"].as_str()), (Some(&*format!("/v1/vms/{name}")), Some(name)));
    drop(c);
    srv.join().unwrap();
}

#[test]
fn parsing_details() {
    assert_eq!(parse(b"").unwrap(), None);
    assert_eq!(parse(b"\r\n\n").unwrap(), None);
    let req = parse(b"\r\nPOST /x HTTP/1.1\nContent-Length: 2\nX-A:  v \t\n\n{}rest").unwrap().unwrap();
    assert_eq!((req.method.as_str(), req.body.as_slice(), req.header("x-a")), ("POST", &b"{}"[..], Some("v")));
    assert!(req.keep_alive());
    assert!(!parse(b"GET / HTTP/1.1\r\nConnection: Close\r\n\r\n").unwrap().unwrap().keep_alive());
    assert!(!parse(b"GET / HTTP/1.0\r\n\r\n").unwrap().unwrap().keep_alive());
    assert!(parse(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").unwrap().unwrap().keep_alive());
    // Pipelined requests come out one at a time.
    let mut input = &b"GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\n\r\n"[..];
    assert_eq!(read_request(&mut input).unwrap().unwrap().path, "/1");
    assert_eq!(read_request(&mut input).unwrap().unwrap().path, "/2");
    assert_eq!(read_request(&mut input).unwrap(), None);
    let json = |b: &[u8]| parse(b).unwrap().unwrap().json::<crate::StopVm>();
    assert_eq!(json(b"POST / HTTP/1.1\r\n\r\n").unwrap_err(), bad("missing JSON body"));
    let e = json(b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\n{\"x\": 1}\n").unwrap_err();
    assert!(e.status == 400 && e.message.contains("unknown field"), "{e}");
    assert_eq!(
        json(b"POST / HTTP/1.1\r\nContent-Length: 16\r\n\r\n{\"grace_ms\": 5}\n").unwrap().grace_ms,
        Some(5)
    );
}

#[test]
fn malformed_requests() {
    let big_header = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEADER_BYTES));
    let big_line = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_HEADER_BYTES));
    let cases: &[(&[u8], u16)] = &[
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /  HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1 x\r\n\r\n", 400),
        (b"G(T / HTTP/1.1\r\n\r\n", 400),
        (b"GET nope HTTP/1.1\r\n\r\n", 400),
        (b"GET /\xff HTTP/1.1\r\n\r\n", 400),
        (b"GET /%zz HTTP/1.1\r\n\r\n", 400),
        (b"GET /%ff HTTP/1.1\r\n\r\n", 400),
        (b"GET /%00 HTTP/1.1\r\n\r\n", 400),
        (b"GET /?a=%4 HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX: \xff\xfe\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400),
        (big_header.as_bytes(), 431),
        (big_line.as_bytes(), 431),
        (b"POST / HTTP/1.1\r\nContent-Length: 1048577\r\n\r\n", 413),
        (b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
        (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
        (b"POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET / HTTP/3\r\n\r\n", 505),
        (b"GET / HTTP/x\r\n\r\n", 400),
        (b"GET / FTP/1.0\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x", 400),
        (b"GET / HTTP/1.1", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc", 400),
    ];
    for (input, want) in cases {
        assert_eq!(status_of(input), *want, "{:?}", String::from_utf8_lossy(&input[..input.len().min(80)]));
    }
    assert_eq!(parse(b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nab").unwrap_err(), bad("incomplete request"));

    /// Yields its bytes once, then fails.
    struct Flaky(&'static [u8]);
    impl Read for Flaky {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match std::mem::take(&mut self.0) {
                [] => Err(io::Error::new(io::ErrorKind::ConnectionReset, "reset")),
                b => {
                    let n = b.len().min(buf.len());
                    buf[..n].copy_from_slice(&b[..n]);
                    Ok(n)
                }
            }
        }
    }
    let e = read_request(&mut BufReader::new(Flaky(b"GET / HTTP/1.1\r\nHo"))).unwrap_err();
    assert_eq!(e, bad("incomplete request"));
    assert_eq!(read_request(&mut BufReader::new(Flaky(b""))).unwrap(), None);
}

#[test]
fn client_limits_and_bad_responses() {
    let huge_head = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "a".repeat(CLIENT_MAX_HEADER_BYTES));
    let cases: Vec<Vec<u8>> = vec![
        huge_head.into_bytes(),
        b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n".to_vec(),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffff\r\nab".to_vec(),
        b"HTTP/1.1 2000 OK\r\n\r\n".to_vec(),
        b"SSH-2.0-hello\r\n\r\n".to_vec(),
    ];
    for raw in cases {
        let (a, b) = UnixStream::pair().unwrap();
        let srv = serve(b, move |_, w| {
            let _ = w.write_all(&raw);
            false
        });
        let e = Client::from_stream(a).request("GET", "/", None).unwrap_err();
        assert!(matches!(e.kind(), io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof), "{e:?}");
        srv.join().unwrap();
    }
    // 1xx is skipped, an EOF-delimited body is read to the end.
    let (a, b) = UnixStream::pair().unwrap();
    let srv = serve(b, |_, w| {
        let _ = w.write_all(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nuntil eof");
        false
    });
    let r = Client::from_stream(a).request("PUT", "/", None).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"until eof"[..]));
    srv.join().unwrap();
    let mut c = Client::from_stream(UnixStream::pair().unwrap().0);
    assert_eq!(c.request("GET", "no-slash", None).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    assert_eq!(c.request("GET", "/a b", None).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    let empty = Response { status: 503, ..Default::default() };
    assert_eq!(empty.error_message(), "Service Unavailable");
    assert_eq!(Response { body: b" oops\n".to_vec(), ..empty }.error_message(), "oops");
}

#[test]
fn random_input_never_panics() {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let seeds: [&[u8]; 4] = [
        b"POST /v1/vms?a=b%20c&d HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        b"GET /v1/vms/%E2%9C%93 HTTP/1.0\nConnection: keep-alive\n\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n",
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 17\r\n\r\n{\"error\":\"nope\"}\n",
    ];
    let alphabet = b" :\r\n\r\n%?&=/+;HTTP/1.01GETPOST0123456789abcdefContent-Length\t\xff\x00";
    for i in 0..5000 {
        let input: Vec<u8> = if i % 3 == 0 {
            (0..next() % 300).map(|_| next() as u8).collect()
        } else if i % 3 == 1 {
            (0..next() % 300).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect()
        } else {
            let mut v = seeds[(next() % 4) as usize].to_vec();
            for _ in 0..1 + next() % 4 {
                let pos = (next() % (v.len() as u64 + 1)) as usize;
                match next() % 3 {
                    0 if pos < v.len() => v[pos] = next() as u8,
                    1 if pos < v.len() => drop(v.remove(pos)),
                    _ => v.insert(pos, alphabet[(next() % alphabet.len() as u64) as usize]),
                }
            }
            v
        };
        let mut r = &input[..];
        for _ in 0..4 {
            match read_request(&mut r) {
                Ok(Some(req)) => assert!(req.body.len() <= MAX_BODY_BYTES && req.path.starts_with('/')),
                Ok(None) => break,
                Err(e) => {
                    assert!((400..=505).contains(&e.status), "{e}");
                    break;
                }
            }
        }
        // The client-side parsers, on the same input.
        let mut r = &input[..];
        if let Ok(Some(head)) = read_response_head(&mut r) {
            if let Ok(f) = framing("GET", &head) {
                let _ = read_body(&mut r, &f, 1 << 16, &mut |_| true);
            }
        }
    }
}

/// A listener on a fresh socket path; the directory is removed by the caller.
fn listener(tag: &str) -> (std::path::PathBuf, UnixListener) {
    let dir = std::env::temp_dir().join(format!("wisp-http-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("api.sock");
    let l = UnixListener::bind(&sock).unwrap();
    (dir, l)
}

#[test]
fn a_request_that_may_have_reached_the_server_is_not_sent_again() {
    // The server answers a GET (keep-alive), then reads a POST in full and closes without answering,
    // as a daemon that created the VM and died would. The client must report it, not send it again.
    let (dir, l) = listener("no-retry");
    let srv = thread::spawn(move || {
        let mut posts = 0;
        loop {
            let (s, _) = l.accept().unwrap();
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            while let Ok(Some(req)) = read_request(&mut r) {
                match req.method.as_str() {
                    "POST" => {
                        posts += 1;
                        break; // read it all, answer nothing, close
                    }
                    _ if req.path == "/done" => return posts,
                    _ => write_response(&mut w, 200, "text/plain", b"ok", true).unwrap(),
                }
            }
        }
    });
    let mut c = Client::connect(&dir.join("api.sock")).unwrap();
    assert_eq!(c.request("GET", "/first", None).unwrap().status, 200);
    let e = c.request("POST", "/v1/vms", Some(b"{\"image\":\"noop\"}")).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    assert!(e.to_string().contains("not sent again"), "{e}");
    // Connections are accepted in order: a re-sent POST would have come before this one.
    let _ = Client::connect(&dir.join("api.sock")).unwrap().request("GET", "/done", None);
    assert_eq!(srv.join().unwrap(), 1, "the POST reached the server twice");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_closed_idle_connection_is_replaced_before_the_request_leaves() {
    // The server closes a kept-alive connection while it is idle (its idle timeout); the next POST
    // goes out once, on a new connection.
    let (dir, l) = listener("stale");
    let (closed_tx, closed_rx) = mpsc::channel();
    let srv = thread::spawn(move || {
        let mut posts = 0;
        for round in 0..2 {
            let (s, _) = l.accept().unwrap();
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            let req = read_request(&mut r).unwrap().unwrap();
            posts += usize::from(req.method == "POST");
            write_response(&mut w, 200, "text/plain", req.method.as_bytes(), true).unwrap();
            if round == 0 {
                drop((r, w));
                closed_tx.send(()).unwrap();
            }
        }
        posts
    });
    let mut c = Client::connect(&dir.join("api.sock")).unwrap();
    assert_eq!(c.request("GET", "/", None).unwrap().body, b"GET");
    closed_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(c.request("POST", "/v1/vms", Some(b"{}")).unwrap().body, b"POST");
    assert_eq!(srv.join().unwrap(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_answer_sent_before_the_server_closes_is_read() {
    // A server at its connection cap answers 503 without reading and closes; the client, still
    // writing a large body, gets EPIPE, and then reads the answer.
    let (a, b) = UnixStream::pair().unwrap();
    let srv = thread::spawn(move || {
        write_error(&mut &b, 503, "too many connections", false).unwrap();
    });
    let body = vec![b'x'; 1 << 20];
    let r = Client::from_stream(a).request("POST", "/v1/vms", Some(&body)).unwrap();
    assert_eq!((r.status, r.error_message().as_str()), (503, "too many connections"));
    srv.join().unwrap();
}

#[test]
fn expect_100_continue_is_answered_before_the_body_is_read() {
    let (mut a, b) = UnixStream::pair().unwrap();
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let srv = thread::spawn(move || {
        let mut w = b.try_clone().unwrap();
        read_request_with(&mut BufReader::new(b), &mut w)
    });
    a.write_all(b"POST /v1/vms HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-Continue\r\n\r\n").unwrap();
    // The body is sent only once the 100 is there, as curl does.
    let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
    let mut got = vec![0; interim.len()];
    a.read_exact(&mut got).expect("no 100 Continue before the body");
    assert_eq!(got, interim);
    a.write_all(b"{}").unwrap();
    assert_eq!(srv.join().unwrap().unwrap().unwrap().body, b"{}");

    // Other expectations are refused; HTTP/1.0's are ignored; a body too large gets 413, no 100.
    let e = parse(b"POST / HTTP/1.1\r\nContent-Length: 2\r\nExpect: fancy\r\n\r\n{}").unwrap_err();
    assert_eq!((e.status, e.message.as_str()), (417, "unsupported expectation 'fancy' (only 100-continue is)"));
    assert!(parse(b"POST / HTTP/1.0\r\nContent-Length: 2\r\nExpect: fancy\r\n\r\n{}").is_ok());
    let mut out = Vec::new();
    let raw = b"POST / HTTP/1.1\r\nContent-Length: 2000000\r\nExpect: 100-continue\r\n\r\n";
    assert_eq!(read_request_with(&mut &raw[..], &mut out).unwrap_err().status, 413);
    assert!(out.is_empty(), "100 Continue sent for a refused request");
    assert_eq!(reason(417), "Expectation Failed");
}

#[test]
fn header_field_count_is_bounded() {
    let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
    let e = parse(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()).unwrap_err();
    assert_eq!((e.status, e.message), (431, format!("too many header fields (limit {MAX_HEADERS})")));
    let ok: String = (0..MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
    assert_eq!(parse(format!("GET / HTTP/1.1\r\n{ok}\r\n").as_bytes()).unwrap().unwrap().headers.len(), MAX_HEADERS);
    // The messages of the checks httparse replaced.
    let msg = |b: &[u8]| parse(b).unwrap_err().message;
    assert_eq!(msg(b"G(T / HTTP/1.1\r\n\r\n"), "invalid method");
    assert_eq!(msg(b"GET / HTTP/2.0\r\n\r\n"), "unsupported HTTP version HTTP/2.0");
    assert_eq!(msg(b"GET /a\x01 HTTP/1.1\r\n\r\n"), "invalid character in request target");
    assert_eq!(msg(b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n"), "obsolete header line folding is not supported");
    assert_eq!(msg(b"GET / HTTP/1.1\r\nNoColon\r\n\r\n"), "malformed header line");
    assert_eq!(msg(b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n"), "invalid header name");
    assert_eq!(msg(b"GET / HTTP/1.1\r\nX: a\x01b\r\n\r\n"), "invalid character in header value");
    assert_eq!(msg(b"GET / HTTP/1.1\r\nX: \xff\r\n\r\n"), "header value is not valid UTF-8");
}
