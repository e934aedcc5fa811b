//! Prometheus' text exposition format, version 0.0.4 (`GET /metrics`): a
//! small writer of metric families (counters, gauges, histograms) with the
//! format's escaping, and a histogram that threads observe without a lock.
//! What the daemon reports is gathered in `daemon/scrape.rs`.
//!
//! The format: each family is `# HELP name text` and `# TYPE name type`,
//! then its samples, one a line, `name{label="value",...} number`, all of a
//! family together. In HELP text a backslash and a newline are escaped
//! (`\\`, `\n`); in a label value a double quote too (`\"`). A
//! histogram's samples are `name_bucket{le="B"}` (cumulative, ending with
//! `le="+Inf"`), `name_sum` and `name_count` (equal to the `+Inf` bucket).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The exposition's `Content-Type`.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// The text of one scrape, written family by family.
#[derive(Default)]
pub struct Text {
    out: String,
    /// The family being written (its samples must follow its header).
    family: String,
}

/// Labels of a sample: (name, value) pairs; names are fixed identifiers,
/// values anything (escaped here).
pub type Labels<'a> = [(&'a str, &'a str)];

impl Text {
    /// Begin family `name` of type `kind`: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        debug_assert!(valid_name(name), "metric name {name:?}");
        let _ = writeln!(self.out, "# HELP {name} {}", escape(help, false));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.name());
        self.family.clear();
        self.family.push_str(name);
    }

    /// A sample of the current family (a counter's or gauge's own name).
    pub fn sample(&mut self, labels: &Labels<'_>, value: f64) {
        let name = std::mem::take(&mut self.family);
        self.line(&name, "", labels, None, &number(value));
        self.family = name;
    }

    /// [`Text::sample`] of a whole number (exact beyond 2^53, as bytes may be).
    pub fn int(&mut self, labels: &Labels<'_>, value: u64) {
        let name = std::mem::take(&mut self.family);
        self.line(&name, "", labels, None, &value.to_string());
        self.family = name;
    }

    /// The samples of one histogram of the current family (begun as a
    /// [`Kind::Histogram`]): cumulative buckets up to `+Inf`, sum, count.
    pub fn histogram(&mut self, labels: &Labels<'_>, h: &Snapshot) {
        let name = std::mem::take(&mut self.family);
        let mut seen = 0u64;
        for (bound, n) in h.bounds.iter().zip(&h.counts) {
            seen += n;
            self.line(&name, "_bucket", labels, Some(&number(*bound)), &seen.to_string());
        }
        let count = h.count();
        self.line(&name, "_bucket", labels, Some("+Inf"), &count.to_string());
        self.line(&name, "_sum", labels, None, &number(h.sum));
        self.line(&name, "_count", labels, None, &count.to_string());
        self.family = name;
    }

    fn line(&mut self, name: &str, suffix: &str, labels: &Labels<'_>, le: Option<&str>, value: &str) {
        let o = &mut self.out;
        o.push_str(name);
        o.push_str(suffix);
        let all = labels.iter().copied().chain(le.map(|b| ("le", b)));
        for (i, (k, v)) in all.enumerate() {
            debug_assert!(valid_label(k), "label name {k:?}");
            o.push(if i == 0 { '{' } else { ',' });
            let _ = write!(o, "{k}=\"{}\"", escape(v, true));
        }
        if !labels.is_empty() || le.is_some() {
            o.push('}');
        }
        o.push(' ');
        o.push_str(value);
        o.push('\n');
    }

    /// The whole text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// `s` escaped for HELP text (backslash, newline) or, with `quote`, for a
/// label value (a double quote too).
pub fn escape(s: &str, quote: bool) -> std::borrow::Cow<'_, str> {
    if !(s.contains(['\\', '\n']) || quote && s.contains('"')) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out.into()
}

/// A value as the format writes it: whole numbers without a fraction,
/// `+Inf`, `-Inf`, `NaN`.
pub fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn valid_name(s: &str) -> bool {
    let mut b = s.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_' || c == b':') && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b':')
}

fn valid_label(s: &str) -> bool {
    let mut b = s.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_') && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// A histogram of durations, observed by any thread without a lock: a
/// count per bucket (not cumulative: an observation touches one) and the
/// sum in nanoseconds.
pub struct Histogram {
    /// Upper bounds in seconds, ascending (the `+Inf` bucket is implied).
    bounds: &'static [f64],
    /// One per bound, then the `+Inf` bucket's own.
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
}

/// What a histogram held at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Upper bounds in seconds.
    pub bounds: Vec<f64>,
    /// Observations per bucket (not cumulative), the `+Inf` bucket's own last.
    pub counts: Vec<u64>,
    /// Sum of the observations in seconds.
    pub sum: f64,
}

impl Snapshot {
    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

impl Histogram {
    /// A histogram with buckets up to each of `bounds` (seconds, ascending).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        Histogram { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum_ns: AtomicU64::new(0) }
    }

    /// Count one observation of `d`.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.iter().position(|b| s <= *b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// The counts now (each bucket read once: the buckets and the count of
    /// one snapshot always agree).
    pub fn snapshot(&self) -> Snapshot {
        let counts = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        Snapshot { bounds: self.bounds.to_vec(), counts, sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_written_with_help_type_and_escaped_labels() {
        let mut t = Text::default();
        t.family("wisp_vms", Kind::Gauge, "VMs by state.");
        t.int(&[("state", "running")], 3);
        t.int(&[("state", "paused")], 0);
        t.family("wisp_x_total", Kind::Counter, "A \\ help\nline.");
        t.sample(&[("vm", "a\"b\\c\nd"), ("name", "")], 1.5);
        t.sample(&[], 2.0);
        t.int(&[], u64::MAX);
        let expect = concat!(
            "# HELP wisp_vms VMs by state.\n",
            "# TYPE wisp_vms gauge\n",
            "wisp_vms{state=\"running\"} 3\n",
            "wisp_vms{state=\"paused\"} 0\n",
            "# HELP wisp_x_total A \\\\ help\\nline.\n",
            "# TYPE wisp_x_total counter\n",
            "wisp_x_total{vm=\"a\\\"b\\\\c\\nd\",name=\"\"} 1.5\n",
            "wisp_x_total 2\n",
            "wisp_x_total 18446744073709551615\n",
        );
        assert_eq!(t.finish(), expect);
    }

    #[test]
    fn help_text_keeps_its_quotes() {
        assert_eq!(escape("say \"hi\"", false), "say \"hi\"");
        assert_eq!(escape("say \"hi\"", true), "say \\\"hi\\\"");
        assert!(matches!(escape("plain", true), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn numbers_as_the_format_writes_them() {
        let cases = [(0.0, "0"), (3.0, "3"), (-2.0, "-2"), (0.25, "0.25"), (0.0005, "0.0005"), (1e15, "1000000000000000"), (f64::INFINITY, "+Inf"), (f64::NEG_INFINITY, "-Inf"), (f64::NAN, "NaN")];
        for (v, s) in cases {
            assert_eq!(number(v), s, "{v}");
        }
    }

    #[test]
    fn histograms_are_cumulative_up_to_inf_with_sum_and_count() {
        static BOUNDS: [f64; 3] = [0.001, 0.01, 0.1];
        let h = Histogram::new(&BOUNDS);
        for us in [500, 1000, 5000, 5000, 250_000] {
            h.observe(Duration::from_micros(us));
        }
        let s = h.snapshot();
        assert_eq!(s.counts, vec![2, 2, 0, 1], "an observation on a bound is in its bucket");
        assert_eq!(s.count(), 5);
        let mut t = Text::default();
        t.family("wisp_boot_seconds", Kind::Histogram, "Boots.");
        t.histogram(&[("kind", "x")], &s);
        let expect = concat!(
            "# HELP wisp_boot_seconds Boots.\n",
            "# TYPE wisp_boot_seconds histogram\n",
            "wisp_boot_seconds_bucket{kind=\"x\",le=\"0.001\"} 2\n",
            "wisp_boot_seconds_bucket{kind=\"x\",le=\"0.01\"} 4\n",
            "wisp_boot_seconds_bucket{kind=\"x\",le=\"0.1\"} 4\n",
            "wisp_boot_seconds_bucket{kind=\"x\",le=\"+Inf\"} 5\n",
            "wisp_boot_seconds_sum{kind=\"x\"} 0.2615\n",
            "wisp_boot_seconds_count{kind=\"x\"} 5\n",
        );
        assert_eq!(t.finish(), expect);
        // Empty, and without labels.
        let mut t = Text::default();
        t.family("h", Kind::Histogram, "H.");
        t.histogram(&[], &Histogram::new(&BOUNDS).snapshot());
        assert!(t.finish().ends_with("h_bucket{le=\"+Inf\"} 0\nh_sum 0\nh_count 0\n"));
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("wisp_vms") && valid_name("a:b_1") && !valid_name("1a") && !valid_name("a-b") && !valid_name(""));
        assert!(valid_label("vm") && valid_label("_x1") && !valid_label("a:b") && !valid_label(""));
    }
}
