//! The API client's response reader (status line, headers, `Content-Length`, chunked and
//! until-EOF bodies): the input is what the "server" sends on a socket pair to a `Client` that made
//! one request. It must never panic, hang or buffer more than its limits.
#![no_main]

use std::io::Write;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;

use libfuzzer_sys::fuzz_target;
use wisp_api::http::{Client, CLIENT_MAX_BODY_BYTES};

// The whole input goes into the socket before the client reads: keep it under the socket buffer.
const MAX_INPUT: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, input)) = data.split_first() else { return };
    let input = &input[..input.len().min(MAX_INPUT)];
    let (ours, mut server) = UnixStream::pair().expect("socketpair");
    server.write_all(input).expect("write the response");
    server.shutdown(Shutdown::Write).expect("shutdown");
    let mut client = Client::from_stream(ours);
    let method = ["GET", "POST", "HEAD", "DELETE"][(ctl & 3) as usize];
    let body: Option<&[u8]> = if ctl & 4 != 0 { Some(b"{}") } else { None };
    if ctl & 8 != 0 {
        let mut got = 0usize;
        let mut stop_after = if ctl & 16 != 0 { 1 } else { usize::MAX };
        let res = client.stream(method, "/v1/vms/x/logs?follow=true", body, &mut |piece: &[u8]| {
            got += piece.len();
            stop_after -= 1;
            stop_after > 0
        });
        assert!(got <= input.len());
        if let Ok(status) = res {
            let _ = client.last_header("content-type");
            if let Some(err) = client.take_error() {
                assert_eq!(err.status, status);
                assert!(err.body.len() <= CLIENT_MAX_BODY_BYTES);
                let _ = err.error_message();
            }
        }
    } else if let Ok(resp) = client.request(method, "/v1/vms", body) {
        assert!(resp.body.len() <= CLIENT_MAX_BODY_BYTES);
        assert!(resp.body.len() <= input.len());
        if method == "HEAD" {
            assert!(resp.body.is_empty(), "a HEAD response has no body");
        }
        let _ = resp.header("content-length");
        let _ = resp.json::<serde_json::Value>();
        let _ = resp.error_message();
    }
    // A second request on the same connection: the server is gone, so it must fail, not panic.
    let _ = client.request("GET", "/v1/version", None);
});
