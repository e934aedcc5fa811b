//! The runtime's log (`--log FILE --log-format text|json`): engines read
//! it for why a command failed (containerd's shim takes the last
//! `"level":"error"` line's `msg`); errors go to stderr as well.

use std::io::Write;
use std::path::PathBuf;

pub struct Log {
    file: Option<PathBuf>,
    json: bool,
    debug: bool,
}

impl Log {
    pub fn new(file: Option<PathBuf>, format: &str, debug: bool) -> Log {
        Log { file, json: format == "json", debug }
    }

    /// A failure: on stderr and in the log.
    pub fn error(&self, msg: &str) {
        eprintln!("wisp-oci: {msg}");
        self.write("error", msg);
    }

    /// Progress, with --debug.
    pub fn debug(&self, msg: &str) {
        if self.debug {
            self.write("debug", msg);
        }
    }

    fn write(&self, level: &str, msg: &str) {
        let Some(path) = &self.file else { return };
        let time = rfc3339(std::time::SystemTime::now());
        let line = if self.json {
            serde_json::json!({ "level": level, "msg": msg, "time": time }).to_string()
        } else {
            format!("time={time:?} level={level} msg={msg:?}")
        };
        // Best effort: a log that cannot be written must not turn a
        // success into a failure.
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// `t` as RFC 3339 in UTC (seconds), e.g. `2026-11-28T20:41:05Z`.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + (month <= 2) as i64;
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3_600, rem % 3_600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_897_665)), "2026-11-28T20:27:45Z");
    }

    #[test]
    fn errors_reach_the_log_as_json() {
        let p = std::env::temp_dir().join(format!("wisp-oci-log-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        Log::new(Some(p.clone()), "json", false).error("no \"image\"");
        let line = std::fs::read_to_string(&p).unwrap();
        let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        assert_eq!((v["level"].as_str(), v["msg"].as_str()), (Some("error"), Some("no \"image\"")));
        let _ = std::fs::remove_file(&p);
    }
}
