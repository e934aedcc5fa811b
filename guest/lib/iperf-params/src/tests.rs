//! Host unit tests (`make test`): what iperf3 3.12 sends (captured), and
//! parameters a hostile client could send.

use std::time::Duration;

use super::*;

fn params(text: &str) -> Result<Params, i32> {
    Params::from_json(&jsonlite::parse(text.as_bytes()).expect("valid JSON"))
}

/// iperf3 3.12's PARAM_EXCHANGE for `-c … -t 2` (captured), with the
/// members in `extra` (`"key":value,…`) set instead or added.
fn msg(extra: &str) -> String {
    let mut members: Vec<String> =
        r#""tcp":true,"omit":0,"time":2,"num":0,"blockcount":0,"parallel":1,"len":131072,"pacing_timer":1000"#
            .split(',')
            .map(str::to_string)
            .collect();
    for m in extra.split(',').filter(|m| !m.is_empty()) {
        let key = m.split(':').next().unwrap();
        members.retain(|old| !old.starts_with(&format!("{key}:")));
        members.push(m.to_string());
    }
    format!(r#"{{{},"client_version":"3.12"}}"#, members.join(","))
}

#[test]
fn what_iperf3_asks_for() {
    let p = params(&msg("")).unwrap();
    assert_eq!(
        (p.proto, p.mode, p.parallel, p.time, p.len, p.rate),
        (Proto::Tcp, Mode::Receive, 1, 2, 131_072, 0)
    );
    assert_eq!((p.streams(), p.send_limit(), p.pacing_us), (1, None, 1000));
    // -R, -P 2, --bidir.
    assert_eq!(params(&msg(r#""reverse":true"#)).unwrap().mode, Mode::Send);
    let p = params(&msg(r#""parallel":2,"bidirectional":true"#)).unwrap();
    assert_eq!((p.mode, p.parallel, p.streams()), (Mode::Both, 2, 4));
    // -u -b 20M (the client sends the control connection's MSS as length).
    let u = r#"{"udp":true,"omit":0,"time":1,"num":0,"blockcount":0,"parallel":1,"len":1448,"bandwidth":20000000,"pacing_timer":1000,"client_version":"3.12"}"#;
    let p = params(u).unwrap();
    assert_eq!(
        (p.proto, p.len, p.rate, p.udp_header()),
        (Proto::Udp, 1448, 20_000_000, 12)
    );
    // -n / -k: limits in bytes or blocks; -k wins only without -n.
    assert_eq!(
        params(&msg(r#""blockcount":3"#)).unwrap().send_limit(),
        Some(3 * 131_072)
    );
    let p = params(r#"{"tcp":true,"num":5000,"blockcount":3,"time":0}"#).unwrap();
    assert_eq!((p.send_limit(), p.time), (Some(5000), 0));
}

#[test]
fn what_the_server_cannot_do_is_refused() {
    assert_eq!(params(r#"{"sctp":true}"#).err(), Some(IENOSCTP));
    // A datagram must fit one frame and hold iperf3's header.
    let udp = |len: usize, extra: &str| params(&format!(r#"{{"udp":true,"len":{len}{extra}}}"#));
    assert_eq!(udp(MAX_DATAGRAM, "").map(|p| p.len), Ok(MAX_DATAGRAM));
    assert_eq!(udp(MAX_DATAGRAM + 1, "").err(), Some(IEBLOCKSIZE));
    assert_eq!(udp(65_507, "").err(), Some(IEBLOCKSIZE));
    assert_eq!(udp(12, "").map(|p| p.len), Ok(12));
    assert_eq!(udp(11, "").err(), Some(IEBLOCKSIZE));
    assert_eq!(
        udp(15, r#","udp_counters_64bit":1"#).err(),
        Some(IEBLOCKSIZE)
    );
    // No length: iperf3's defaults.
    assert_eq!(params(r#"{"udp":true}"#).map(|p| p.len), Ok(1460));
    assert_eq!(
        params(r#"{}"#).map(|p| (p.proto, p.len)),
        Ok((Proto::Tcp, 128 << 10))
    );
}

#[test]
fn out_of_range_numbers_are_clamped_or_refused() {
    // Streams: 1..=128.
    for (n, want) in [
        ("0", 1),
        ("-5", 1),
        ("128", 128),
        ("129", 128),
        ("1e999999999", 128),
        ("2.7", 2),
    ] {
        assert_eq!(
            params(&msg(&format!(r#""parallel":{n}"#))).map(|p| p.parallel),
            Ok(want),
            "parallel {n}"
        );
    }
    // Pacing: 100 µs..1 s; negative numbers count as 0.
    assert_eq!(
        params(r#"{"pacing_timer":-1e99}"#).map(|p| p.pacing_us),
        Ok(100)
    );
    assert_eq!(
        params(r#"{"pacing_timer":1e99}"#).map(|p| p.pacing_us),
        Ok(1_000_000)
    );
    assert_eq!(
        params(r#"{"time":-3,"len":-1}"#).map(|p| (p.time, p.len)),
        Ok((0, 128 << 10))
    );
    assert_eq!(params(r#"{"len":1e999}"#).map(|p| p.len), Ok(1 << 30));
    // Huge byte and block counts saturate.
    let p = params(r#"{"blockcount":1e999,"len":1e999}"#).unwrap();
    assert_eq!(p.send_limit(), Some(u64::MAX));
    assert!(p.memory(MAX_SOCKET_BUFFER) < 1 << 40);
    // Durations past iperf3's own limits: refused (they overflowed the
    // test's time limit and panicked the app).
    assert_eq!(params(&msg(r#""time":86401"#)).err(), Some(IEDURATION));
    assert_eq!(
        params(r#"{"time":2,"time":86401}"#).map(|p| p.time),
        Ok(2),
        "the first of two members counts"
    );
    assert_eq!(
        params(r#"{"time":1e999999999,"omit":1e999999999}"#).err(),
        Some(IEDURATION)
    );
    assert_eq!(
        params(r#"{"time":9223372036854775807}"#).err(),
        Some(IEDURATION)
    );
    assert_eq!(params(r#"{"time":10,"omit":601}"#).err(), Some(IEOMIT));
    assert_eq!(params(r#"{"time":10,"omit":1e999}"#).err(), Some(IEOMIT));
    let slack = Duration::from_secs(30);
    let p = params(&format!(r#"{{"time":{MAX_TIME},"omit":{MAX_OMIT}}}"#)).unwrap();
    assert_eq!(
        p.time_limit(slack),
        Duration::from_secs(MAX_TIME + MAX_OMIT + 30)
    );
    assert_eq!(
        params(r#"{"time":0,"num":1}"#).unwrap().time_limit(slack),
        Duration::from_secs(86_400)
    );
}

#[test]
fn no_accepted_parameters_overflow_the_time_limit() {
    // Whatever a client sends, the numbers the app computes with stay
    // finite: every accepted combination of extreme values.
    let extremes = [
        "0",
        "1",
        "-1",
        "600",
        "601",
        "86400",
        "86401",
        "4294967296",
        "9223372036854775807",
        "1e999999999",
        "-1e999999999",
    ];
    for t in extremes {
        for o in extremes {
            if let Ok(p) = params(&format!(
                r#"{{"time":{t},"omit":{o},"parallel":{t},"len":{o},"bandwidth":{t}}}"#
            )) {
                assert!(
                    p.time_limit(Duration::from_secs(30))
                        <= Duration::from_secs(MAX_TIME + MAX_OMIT + 30)
                );
                assert!(p.memory(MIN_SOCKET_BUFFER) >= p.streams());
                let _ = p.describe(MIN_SOCKET_BUFFER);
            }
        }
    }
}

#[test]
fn socket_buffers_follow_the_heap() {
    assert_eq!(socket_buffer(0), MIN_SOCKET_BUFFER);
    assert_eq!(socket_buffer(4 << 20), MIN_SOCKET_BUFFER);
    assert_eq!(socket_buffer(6 << 20), MIN_SOCKET_BUFFER);
    assert_eq!(socket_buffer(12 << 20), 256 << 10, "the default 16 MiB VM");
    assert_eq!(socket_buffer(16 << 20), MAX_SOCKET_BUFFER);
    assert_eq!(socket_buffer(usize::MAX), MAX_SOCKET_BUFFER);
}
