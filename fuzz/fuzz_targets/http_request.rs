//! The API server's request parser: `read_request` (and `read_request_with`, which answers
//! `Expect: 100-continue`) over a `BufReader` of the input, request after request as on a
//! keep-alive connection, must never panic and never read past what it reports.
#![no_main]

use std::io::BufReader;

use libfuzzer_sys::fuzz_target;
use wisp_api::http::{read_request, read_request_with, MAX_BODY_BYTES, MAX_HEADERS};

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, input)) = data.split_first() else { return };
    // Small buffer capacities put the head's end and the body across reads.
    let cap = match ctl & 0x3f {
        0 => 8192,
        n => n as usize,
    };
    let mut r = BufReader::with_capacity(cap, input);
    let mut interim = Vec::new();
    for _ in 0..16 {
        let res = if ctl & 0x40 != 0 { read_request_with(&mut r, &mut interim) } else { read_request(&mut r) };
        let req = match res {
            Ok(Some(req)) => req,
            Ok(None) => break,
            Err(e) => {
                assert!((400..600).contains(&e.status), "status {}", e.status);
                break;
            }
        };
        assert!(req.body.len() <= MAX_BODY_BYTES);
        assert!(req.headers.len() <= MAX_HEADERS + 1);
        assert!(req.path.starts_with('/'));
        for (n, _) in &req.headers {
            assert_eq!(*n, n.to_ascii_lowercase(), "header names are lower-cased");
        }
        let _ = req.keep_alive();
        let _ = req.header("content-length");
        let _ = req.query_param("attach");
        let _ = req.json::<serde_json::Value>();
        if !req.keep_alive() {
            break;
        }
    }
    // Only ever a `100 Continue` interim response.
    assert!(interim.chunks(25).all(|c| c == b"HTTP/1.1 100 Continue\r\n\r\n"), "{:?}", String::from_utf8_lossy(&interim));
});
