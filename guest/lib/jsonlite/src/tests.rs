//! Host unit tests (`cargo test -p jsonlite`, part of `make test`): what
//! iperf3 sends, and hostile input that must be refused or parsed at once.

use std::sync::mpsc;
use std::time::Duration;

use super::*;

/// Parse on another thread; fail (instead of hanging the test run) if it
/// has not finished after a few seconds. A bounded parse of these inputs
/// takes microseconds; an unbounded one takes minutes.
fn parse_bounded(text: Vec<u8>) -> Result<Object, Error> {
    let (tx, rx) = mpsc::channel();
    let what = String::from_utf8_lossy(&text[..text.len().min(60)]).into_owned();
    std::thread::spawn(move || {
        let _ = tx.send(parse(&text));
    });
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(r) => r,
        Err(_) => panic!("parsing {what}… did not finish within 5 s"),
    }
}

/// The parameters iperf3 3.12 sent for `-t 1 -R` (captured).
const REVERSE: &str = r#"{"tcp":true,"omit":0,"time":1,"num":0,"blockcount":0,"parallel":1,"reverse":true,"len":131072,"pacing_timer":1000,"client_version":"3.12"}"#;

#[test]
fn what_iperf3_sends() {
    let o = parse(REVERSE.as_bytes()).unwrap();
    assert!(o.flag("tcp") && o.has("reverse") && !o.has("udp"));
    assert_eq!(
        (o.int("time"), o.int("parallel"), o.int("len")),
        (Some(1), Some(1), Some(131_072))
    );
    assert_eq!(o.get("client_version"), Some(&Value::Str("3.12".into())));
    let udp = r#"{"udp":true,"omit":0,"time":1,"num":0,"blockcount":0,"parallel":1,"len":1448,"bandwidth":20000000,"pacing_timer":1000,"client_version":"3.12"}"#;
    let o = parse(udp.as_bytes()).unwrap();
    assert_eq!(
        (o.int("bandwidth"), o.int("len")),
        (Some(20_000_000), Some(1448))
    );
    // A title with escapes, whitespace, nested values that are skipped.
    let t = " {\"title\" : \"a \\\"t\\\"\\n\\u00e9\\ud83d\\ude00\", \"extra\": {\"x\":[1,2,{}]}, \"n\":null , \"f\":false}\n";
    let o = parse(t.as_bytes()).unwrap();
    assert_eq!(o.get("title"), Some(&Value::Str("a \"t\"\né😀".into())));
    assert_eq!(
        (o.get("extra"), o.get("n"), o.int("f")),
        (Some(&Value::Nested), Some(&Value::Null), Some(0))
    );
    assert!(parse(b"{}").unwrap().get("x").is_none());
}

#[test]
fn numbers_are_truncated_saturating_integers() {
    let n = |s: &str| parse(format!("{{\"v\":{s}}}").as_bytes()).map(|o| o.int("v").unwrap());
    assert_eq!(n("0"), Ok(0));
    assert_eq!(n("-17"), Ok(-17));
    assert_eq!(n("2.9"), Ok(2));
    assert_eq!(n("-2.9"), Ok(-2));
    assert_eq!(n("1.5e3"), Ok(1500));
    assert_eq!(n("15E-1"), Ok(1));
    assert_eq!(n("1e+2"), Ok(100));
    assert_eq!(n("9223372036854775807"), Ok(i64::MAX));
    assert_eq!(n("99999999999999999999999"), Ok(i64::MAX));
    assert_eq!(n("-99999999999999999999999"), Ok(-i64::MAX));
    assert_eq!(
        n("123456789012345678901234e-5"),
        Ok(1_234_567_890_123_456_789)
    );
    assert_eq!(n("0.0000001e7"), Ok(1));
    for bad in [
        "-", "1.", ".5", "01", "1e", "1e+", "--1", "+1", "0x10", "1.e3", "Infinity", "NaN",
    ] {
        assert!(n(bad).is_err(), "{bad} accepted");
    }
}

#[test]
fn huge_exponents_are_parsed_at_once() {
    // Each of these made the old parser multiply ~1e9 times.
    let n =
        |s: &str| parse_bounded(format!("{{\"v\":{s}}}").into_bytes()).map(|o| o.int("v").unwrap());
    assert_eq!(n("1e999999999"), Ok(i64::MAX));
    assert_eq!(n("-1e999999999"), Ok(-i64::MAX));
    assert_eq!(n("0e999999999"), Ok(0));
    assert_eq!(n("1e-999999999"), Ok(0));
    assert_eq!(n("7e99999999999999999999999999"), Ok(i64::MAX));
    assert_eq!(n("7e-99999999999999999999999999"), Ok(0));
    // Many of them, where values are skipped: a 256 KiB message (iperf's
    // limit) holds thousands.
    let many: Vec<String> = (0..4000)
        .map(|i| format!("{}e2147483647", i % 9 + 1))
        .collect();
    let text = format!(
        "{{\"time\":1,\"skipped\":[{}],\"len\":5e2147483647}}",
        many.join(",")
    );
    let o = parse_bounded(text.into_bytes()).unwrap();
    assert_eq!(
        (o.int("time"), o.get("skipped"), o.int("len")),
        (Some(1), Some(&Value::Nested), Some(i64::MAX))
    );
    // A number longer than any real one is refused.
    let long = format!("{{\"v\":1{}}}", "0".repeat(MAX_NUMBER));
    assert_eq!(
        parse_bounded(long.into_bytes()).err(),
        Some(Error::NumberTooLong)
    );
}

#[test]
fn deep_nesting_is_refused() {
    for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
        let deep = format!(
            "{{\"v\":{}1{}}}",
            open.repeat(100_000),
            close.repeat(100_000)
        );
        assert_eq!(parse_bounded(deep.into_bytes()).err(), Some(Error::TooDeep));
        let ok = format!(
            "{{\"v\":{}1{}}}",
            open.repeat(MAX_DEPTH),
            close.repeat(MAX_DEPTH)
        );
        assert_eq!(
            parse_bounded(ok.into_bytes()).unwrap().get("v"),
            Some(&Value::Nested)
        );
        let over = format!(
            "{{\"v\":{}1{}}}",
            open.repeat(MAX_DEPTH + 1),
            close.repeat(MAX_DEPTH + 1)
        );
        assert_eq!(parse_bounded(over.into_bytes()).err(), Some(Error::TooDeep));
    }
    // Unclosed: no overflow either.
    assert_eq!(
        parse_bounded(format!("{{\"v\":{}", "[".repeat(1 << 20)).into_bytes()).err(),
        Some(Error::TooDeep)
    );
}

#[test]
fn huge_strings_and_objects_are_refused() {
    let fits = "x".repeat(MAX_STRING);
    let o = parse_bounded(format!("{{\"title\":\"{fits}\"}}").into_bytes()).unwrap();
    assert_eq!(o.get("title"), Some(&Value::Str(fits.clone())));
    let big = "x".repeat(MAX_STRING + 1);
    for text in [
        format!("{{\"title\":\"{big}\"}}"),
        format!("{{\"{big}\":1}}"),
        format!("{{\"skipped\":[\"{big}\"]}}"),
        format!("{{\"skipped\":{{\"{big}\":1}}}}"),
        // Escapes count as what they decode to, and a long run of them too.
        format!("{{\"t\":\"{}\"}}", "\\u00e9".repeat(MAX_STRING)),
        format!("{{\"t\":\"{}", "y".repeat(1 << 20)),
    ] {
        assert_eq!(
            parse_bounded(text.into_bytes()).err(),
            Some(Error::StringTooLong)
        );
    }
    // Members: as many as a real message has, not a heap's worth.
    let members = |n: usize| {
        (0..n)
            .map(|i| format!("\"k{i}\":{i}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let o = parse_bounded(format!("{{{}}}", members(MAX_MEMBERS)).into_bytes()).unwrap();
    assert_eq!(
        o.int(&format!("k{}", MAX_MEMBERS - 1)),
        Some(MAX_MEMBERS as i64 - 1)
    );
    let r = parse_bounded(format!("{{{}}}", members(MAX_MEMBERS + 1)).into_bytes());
    assert_eq!(r.err(), Some(Error::TooManyMembers));
    let r = parse_bounded(format!("{{\"n\":[{}]}}", "0,".repeat(200_000) + "0").into_bytes());
    assert!(
        r.is_ok(),
        "skipped arrays have no member limit, only nesting and input length"
    );
}

#[test]
fn truncated_and_malformed_input_is_an_error() {
    // Every proper prefix of a real message.
    let full = REVERSE.as_bytes();
    for end in 0..full.len() {
        assert!(
            parse_bounded(full[..end].to_vec()).is_err(),
            "prefix {:?} accepted",
            &REVERSE[..end]
        );
    }
    for bad in [
        "",
        "{",
        "{\"a\"",
        "{\"a\":",
        "{\"a\":1",
        "{\"a\":1,",
        "{\"a\":1,}",
        "{\"a\":tru",
        "{\"a\":nul",
        "{\"a\":\"x",
        "{\"a\":\"\\",
        "{\"a\":\"\\u12",
        "{\"a\":\"\\u+041\"}",
        "{\"a\":\"\\x41\"}",
        "{\"a\":\"\\ud83d\"}",
        "{\"a\":\"\\ude00\"}",
        "{\"a\":\"tab\there\"}",
        "{\"a\":[1,}",
        "{\"a\":[1 2]}",
        "{\"a\":{\"b\"}}",
        "{\"a\":1}}",
        "{\"a\":1} x",
        "[1]",
        "\"a\"",
        "{a:1}",
        "{\"a\":1 \"b\":2}",
        "{\"a\":\"\u{0}\"}",
    ] {
        assert!(
            parse_bounded(bad.as_bytes().to_vec()).is_err(),
            "{bad:?} accepted"
        );
    }
    // Not UTF-8.
    assert!(parse(b"{\"a\":\"\xff\"}").is_err());
}

#[test]
fn writing() {
    assert_eq!(
        quote("a\"b\\c\nd\te\u{1}é"),
        "\"a\\\"b\\\\c\\nd\\te\\u0001é\""
    );
    assert_eq!(seconds(1_500_000_000), "1.500000");
    assert_eq!(seconds(999), "0.000000");
    assert_eq!(seconds(u64::MAX), "18446744073.709551");
    // What we write, we read back.
    let text = format!(
        "{{\"s\":{},\"t\":{}}}",
        quote("x\"\n\u{1f}y"),
        seconds(2_000_123_000)
    );
    let o = parse(text.as_bytes()).unwrap();
    assert_eq!(
        (o.get("s"), o.int("t")),
        (Some(&Value::Str("x\"\n\u{1f}y".into())), Some(2))
    );
}
