//! The HTTP rules of the content cache, apart from its I/O so that they
//! are tested on the host: `Range` (RFC 9110 §14: one or several ranges,
//! suffix and open ranges, 416 when none is satisfiable, at most
//! [`MAX_RANGES`] and coalesced when they overlap), conditional requests
//! (§13: `If-None-Match` with weak comparison, `If-Modified-Since`), HTTP
//! dates (IMF-fixdate), and the heads of the responses. Request parsing
//! itself is `httparse`'s, in the app.
#![no_std]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

/// Most ranges a request may ask for (more: the whole object, 200).
pub const MAX_RANGES: usize = 16;

/// What a `Range` header asks of an object of `size` bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ranges {
    /// No usable Range: the whole object (also for a malformed header or
    /// a unit other than bytes, as RFC 9110 says to ignore those).
    Whole,
    /// These byte ranges, `[start, end)`, sorted and coalesced.
    Parts(Vec<(u64, u64)>),
    /// None is satisfiable: 416.
    Unsatisfiable,
}

/// Parse `Range: bytes=...` for an object of `size` bytes.
pub fn ranges(header: Option<&str>, size: u64) -> Ranges {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else { return Ranges::Whole };
    let mut parts: Vec<(u64, u64)> = Vec::new();
    let mut any = false;
    for item in spec.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        any = true;
        if parts.len() > MAX_RANGES * 4 {
            return Ranges::Whole;
        }
        let Some((a, b)) = item.split_once('-') else { return Ranges::Whole };
        let (a, b) = (a.trim(), b.trim());
        let num = |s: &str| -> Option<u64> { (!s.is_empty() && s.len() <= 19 && s.bytes().all(|c| c.is_ascii_digit())).then(|| s.parse().ok()).flatten() };
        let r = match (a.is_empty(), b.is_empty()) {
            // -N: the last N bytes.
            (true, false) => match num(b) {
                Some(0) => None,
                Some(n) => Some((size.saturating_sub(n), size)),
                None => return Ranges::Whole,
            },
            // A-: from A to the end.
            (false, true) => match num(a) {
                Some(s) => Some((s, size)),
                None => return Ranges::Whole,
            },
            (false, false) => match (num(a), num(b)) {
                (Some(s), Some(e)) if s <= e => Some((s, e.saturating_add(1).min(size))),
                _ => return Ranges::Whole,
            },
            (true, true) => return Ranges::Whole,
        };
        if let Some((s, e)) = r.filter(|(s, e)| s < e && *s < size) {
            parts.push((s, e));
        }
    }
    if !any {
        return Ranges::Whole;
    }
    if parts.is_empty() {
        return Ranges::Unsatisfiable;
    }
    parts.sort();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in parts {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    if merged.len() > MAX_RANGES {
        return Ranges::Whole;
    }
    Ranges::Parts(merged)
}

/// Whether `If-None-Match` matches `etag` (weak comparison; `*` matches).
pub fn none_match(header: &str, etag: &str) -> bool {
    let strip = |t: &str| t.trim().trim_start_matches("W/").trim_matches('"').into();
    let want: String = strip(etag);
    header.split(',').any(|t| t.trim() == "*" || strip(t) == want)
}

const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// An HTTP date (IMF-fixdate) of Unix seconds `t`.
pub fn http_date(t: u64) -> String {
    let days = (t / 86_400) as i64;
    let secs = t % 86_400;
    let (y, m, d) = civil_from_days(days);
    let mut s = String::new();
    let _ = write!(
        s,
        "{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT",
        DAYS[(days % 7) as usize],
        d,
        MONTHS[(m - 1) as usize],
        y,
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    );
    s
}

/// Unix seconds of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`);
/// `None` for anything else (the header is then ignored).
pub fn parse_http_date(s: &str) -> Option<u64> {
    let mut it = s.split_ascii_whitespace();
    let (_day, d, mon, y, hms, gmt) = (it.next()?, it.next()?, it.next()?, it.next()?, it.next()?, it.next()?);
    if gmt != "GMT" || it.next().is_some() {
        return None;
    }
    let d: u32 = d.parse().ok().filter(|d| (1..=31).contains(d))?;
    let m = MONTHS.iter().position(|x| *x == mon)? as u32 + 1;
    let y: i64 = y.parse().ok().filter(|y| (1970..=9999).contains(y))?;
    let mut t = hms.split(':');
    let (h, mi, se): (u64, u64, u64) = (t.next()?.parse().ok()?, t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    if h > 23 || mi > 59 || se > 60 || t.next().is_some() {
        return None;
    }
    Some(days_from_civil(y, m, d) as u64 * 86_400 + h * 3600 + mi * 60 + se)
}

/// The reason phrase of a status.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        206 => "Partial Content",
        304 => "Not Modified",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        414 => "URI Too Long",
        416 => "Range Not Satisfiable",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// A response head: the status line, `headers`, and `Content-Length`
/// and `Connection` (keep-alive or close), ended by the blank line.
pub fn head(status: u16, headers: &[(&str, &str)], length: u64, keep_alive: bool) -> String {
    let mut s = String::with_capacity(256);
    let _ = write!(s, "HTTP/1.1 {} {}\r\n", status, reason(status));
    for (k, v) in headers {
        let _ = write!(s, "{k}: {v}\r\n");
    }
    let _ = write!(s, "Content-Length: {length}\r\nConnection: {}\r\n\r\n", if keep_alive { "keep-alive" } else { "close" });
    s
}

/// The boundary of multipart/byteranges responses (no object's bytes are
/// checked against it; it only has to be unlikely in them, as RFC 9110
/// asks, and the same for every response keeps them reproducible).
pub const BOUNDARY: &str = "wisp-cache-3d6b9a1f0c42e87b";

/// The part head of range `(s, e)` of an object of `size` bytes of `mime`
/// type, in a multipart/byteranges body.
pub fn part_head(mime: &str, s: u64, e: u64, size: u64) -> String {
    let mut h = String::new();
    let _ = write!(h, "\r\n--{BOUNDARY}\r\nContent-Type: {mime}\r\nContent-Range: bytes {}-{}/{size}\r\n\r\n", s, e - 1);
    h
}

/// The end of a multipart/byteranges body.
pub fn multipart_end() -> String {
    let mut s = String::new();
    let _ = write!(s, "\r\n--{BOUNDARY}--\r\n");
    s
}

/// Bytes of a multipart/byteranges body for `parts`.
pub fn multipart_len(mime: &str, parts: &[(u64, u64)], size: u64) -> u64 {
    parts.iter().map(|&(s, e)| part_head(mime, s, e, size).len() as u64 + (e - s)).sum::<u64>() + multipart_end().len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn ranges_follow_rfc_9110() {
        assert_eq!(ranges(None, 100), Ranges::Whole);
        assert_eq!(ranges(Some("bytes=0-9"), 100), Ranges::Parts(vec![(0, 10)]));
        assert_eq!(ranges(Some("bytes=90-"), 100), Ranges::Parts(vec![(90, 100)]));
        assert_eq!(ranges(Some("bytes=-5"), 100), Ranges::Parts(vec![(95, 100)]));
        assert_eq!(ranges(Some("bytes=-500"), 100), Ranges::Parts(vec![(0, 100)]));
        assert_eq!(ranges(Some("bytes=95-200"), 100), Ranges::Parts(vec![(95, 100)]));
        assert_eq!(ranges(Some("bytes=0-1,5-6"), 100), Ranges::Parts(vec![(0, 2), (5, 7)]));
        // Overlapping and adjacent ones coalesce, in order.
        assert_eq!(ranges(Some("bytes=50-60, 0-10, 55-70, 11-20"), 100), Ranges::Parts(vec![(0, 21), (50, 71)]));
        assert_eq!(ranges(Some("bytes=100-"), 100), Ranges::Unsatisfiable);
        assert_eq!(ranges(Some("bytes=-0"), 100), Ranges::Unsatisfiable);
        assert_eq!(ranges(Some("bytes=0-0"), 0), Ranges::Unsatisfiable);
        // Malformed, another unit, absurd: ignored (the whole object).
        for h in ["bytes=a-b", "bytes=5-1", "items=0-1", "bytes=", "bytes=-", "bytes=99999999999999999999-", "bytes=0-1;2-3"] {
            assert_eq!(ranges(Some(h), 100), Ranges::Whole, "{h}");
        }
        let many: String = (0..40).map(|i| alloc::format!("{}-{},", i * 2, i * 2)).collect();
        assert_eq!(ranges(Some(&alloc::format!("bytes={many}")), 1000), Ranges::Whole, "more than MAX_RANGES");
        let overlapping: String = (0..1000).map(|_| "0-10,").collect();
        assert_eq!(ranges(Some(&alloc::format!("bytes={overlapping}")), 1000), Ranges::Whole, "a flood of ranges");
    }

    #[test]
    fn conditionals() {
        assert!(none_match("\"abc\"", "\"abc\""));
        assert!(none_match("W/\"abc\", \"x\"", "\"abc\""));
        assert!(none_match("*", "\"abc\""));
        assert!(!none_match("\"abd\"", "\"abc\""));
    }

    #[test]
    fn dates_round_trip() {
        assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"), Some(784_111_777));
        for t in [0u64, 951_782_400, 1_700_000_000, 4_102_444_800] {
            assert_eq!(parse_http_date(&http_date(t)), Some(t), "{t}");
        }
        for bad in ["", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:37 UTC", "Sun, 32 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 25:00:00 GMT"] {
            assert_eq!(parse_http_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn heads_and_multipart() {
        let h = head(206, &[("Content-Type", "text/plain")], 5, true);
        assert_eq!(h, "HTTP/1.1 206 Partial Content\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\n");
        let parts = [(0u64, 2u64), (5, 7)];
        let body_len = multipart_len("text/plain", &parts, 100);
        let mut body = String::new();
        for &(s, e) in &parts {
            body.push_str(&part_head("text/plain", s, e, 100));
            body.push_str(&"x".repeat((e - s) as usize));
        }
        body.push_str(&multipart_end());
        assert_eq!(body.len() as u64, body_len);
        assert!(body.contains("Content-Range: bytes 5-6/100"));
    }
}
