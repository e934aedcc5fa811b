//! The API router: `Action::from_request` over requests parsed from the input (and over requests
//! built field by field, which the parser would refuse) never panics; an action it accepts turns
//! back into an HTTP request (`Action::to_request`) that parses to the same action.
#![no_main]

use std::io::BufReader;

use libfuzzer_sys::fuzz_target;
use wisp_api::action::Action;
use wisp_api::http::{read_request, Request};

fn round_trip(action: &Action) {
    let call = action.to_request();
    let body = call.body.clone().unwrap_or_default();
    let text = format!("{} {} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", call.method, call.target, body.len());
    let mut bytes = text.into_bytes();
    bytes.extend_from_slice(&body);
    let req = match read_request(&mut BufReader::new(&bytes[..])) {
        Ok(Some(req)) => req,
        other => panic!("{action:?} became {:?}, which does not parse: {other:?}", String::from_utf8_lossy(&bytes)),
    };
    match Action::from_request(&req) {
        Ok(back) => assert_eq!(&back, action, "round trip through {:?}", String::from_utf8_lossy(&bytes)),
        Err(e) => panic!("{action:?} became {:?}, refused: {} {}", String::from_utf8_lossy(&bytes), e.status, e.message),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, input)) = data.split_first() else { return };
    let req = if ctl & 1 == 0 {
        match read_request(&mut BufReader::new(input)) {
            Ok(Some(req)) => req,
            _ => return,
        }
    } else {
        // Fields straight from the input: method, path, query, body separated by 0xff.
        let mut parts = input.split(|&b| b == 0xff).map(|p| String::from_utf8_lossy(p).into_owned());
        let method = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"][(ctl as usize >> 1) % 6].to_string();
        let path = parts.next().unwrap_or_default();
        let mut query = Vec::new();
        let mut body = Vec::new();
        while let Some(k) = parts.next() {
            match parts.next() {
                Some(v) => query.push((k, v)),
                None => body = k.into_bytes(),
            }
        }
        Request { method, path, query, headers: Vec::new(), body }
    };
    match Action::from_request(&req) {
        Ok(action) => {
            let _ = action.streams();
            // Only requests the parser could have produced round-trip: a path the parser refuses
            // (control characters, e.g. artifacts/api_action/crash-b81edc8c…) is accepted by
            // `from_request` as part of a VM name, but `to_request` then encodes a path that
            // `read_request` refuses. The daemon only routes parsed requests.
            if !req.path.chars().any(char::is_control) {
                round_trip(&action);
            }
        }
        Err(e) => assert!((400..500).contains(&e.status), "status {}", e.status),
    }
});
