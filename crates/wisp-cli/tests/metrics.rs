//! `GET /metrics` on wispd's API socket, scraped with curl as Prometheus
//! would (through a proxy): the text is Prometheus' exposition format
//! 0.0.4, line by line; VMs by state, boots and their latency, per-VM CPU
//! time and resident memory, a NIC's counters named from the VM's side;
//! a removed VM's series go with it; the API's access rules apply.

mod common;

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};
use std::time::Duration;

use common::daemon::Daemon;
use wisp_api::{CreateVm, VmState};

/// A group id no account on a test machine is expected to have (not
/// api.rs's: the tests may run at once).
const GROUP: u32 = 64243;
const NOBODY: &str = "65534";
const MIB16: &str = "16777216";

/// One sample line.
#[derive(Clone, Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, k: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }
}

/// A scrape, parsed and checked against the format.
struct Scrape {
    text: String,
    samples: Vec<Sample>,
    types: HashMap<String, String>,
}

impl Scrape {
    /// The samples of metric `name` whose labels include `with`.
    fn find(&self, name: &str, with: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples.iter().filter(|s| s.name == name && with.iter().all(|(k, v)| s.label(k) == Some(*v))).collect()
    }

    /// The one sample of `name` with labels `with` (fails if there is not exactly one).
    fn value(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        let found = self.find(name, with);
        assert_eq!(found.len(), 1, "{name} {with:?}: {found:?}\n{}", self.text);
        found[0].value
    }
}

fn valid_name(s: &str, colon: bool) -> bool {
    let mut b = s.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_' || (colon && c == b':'))
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || (colon && c == b':'))
}

/// Parse `{k="v",...}` at the start of `s` (escapes: `\\`, `\"`, `\n`);
/// the labels and the rest.
fn parse_labels(s: &str) -> Result<(Vec<(String, String)>, &str), String> {
    let mut labels = Vec::new();
    let mut rest = s.strip_prefix('{').ok_or("no '{'")?;
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let (name, r) = rest.split_once("=\"").ok_or_else(|| format!("no label at {rest:?}"))?;
        if !valid_name(name, false) {
            return Err(format!("label name {name:?}"));
        }
        let (mut value, mut chars) = (String::new(), r.char_indices());
        let end = loop {
            match chars.next().ok_or("unterminated label value")? {
                (i, '"') => break i,
                (_, '\\') => match chars.next().ok_or("escape at the end")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    c => return Err(format!("escape \\{c}")),
                },
                (_, '\n') => return Err("newline in a label value".into()),
                (_, c) => value.push(c),
            }
        };
        if labels.iter().any(|(n, _): &(String, String)| n == name) {
            return Err(format!("label {name} twice"));
        }
        labels.push((name.to_string(), value));
        rest = &r[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|_| format!("value {s:?}")),
    }
}

/// Parse the text line by line as the exposition format 0.0.4: HELP and
/// TYPE before a family's samples, a family's samples together, labels
/// escaped, histogram buckets cumulative up to `le="+Inf"` equal to
/// `_count`, with a `_sum`.
fn parse(text: &str) -> Scrape {
    let (mut helps, mut types) = (HashSet::new(), HashMap::new());
    let (mut samples, mut done, mut current) = (Vec::new(), HashSet::<String>::new(), String::new());
    assert!(text.ends_with('\n'), "the text does not end with a newline");
    for (n, line) in text.lines().enumerate() {
        let fail = |why: String| -> ! { panic!("line {}: {why}: {line:?}\n{text}", n + 1) };
        if let Some(c) = line.strip_prefix("# ") {
            let mut w = c.splitn(3, ' ');
            let (kw, name, rest) = (w.next().unwrap_or(""), w.next().unwrap_or(""), w.next());
            let fresh = |set_has: bool| if set_has { fail(format!("second {kw} for {name}")) };
            match kw {
                "HELP" => {
                    fresh(!helps.insert(name.to_string()));
                    let help = rest.unwrap_or_else(|| fail("no help text".into()));
                    let bad = help.split("\\\\").any(|p| p.split('\\').skip(1).any(|e| !e.starts_with('n')));
                    if bad {
                        fail("an escape other than \\\\ or \\n in HELP".into());
                    }
                }
                "TYPE" => {
                    let t = rest.unwrap_or_else(|| fail("no type".into()));
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&t) {
                        fail(format!("type {t}"));
                    }
                    fresh(types.insert(name.to_string(), t.to_string()).is_some());
                }
                _ => continue,
            }
            if !valid_name(name, true) {
                fail(format!("metric name {name:?}"));
            }
            if name != current {
                if done.contains(name) {
                    fail(format!("family {name} resumed"));
                }
                if !current.is_empty() {
                    done.insert(std::mem::take(&mut current));
                }
                current = name.to_string();
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            fail("an empty line or a comment without '# '".into());
        }
        let end = line.find(['{', ' ']).unwrap_or_else(|| fail("no value".into()));
        let name = &line[..end];
        if !valid_name(name, true) {
            fail(format!("metric name {name:?}"));
        }
        let (labels, rest) = if line[end..].starts_with('{') { parse_labels(&line[end..]).unwrap_or_else(|e| fail(e)) } else { (Vec::new(), &line[end..]) };
        let mut fields = rest.strip_prefix(' ').unwrap_or_else(|| fail("no space before the value".into())).split(' ');
        let value = parse_value(fields.next().unwrap_or("")).unwrap_or_else(|e| fail(e));
        if let Some(ts) = fields.next() {
            ts.parse::<i64>().unwrap_or_else(|_| fail(format!("timestamp {ts:?}")));
        }
        // Its family: the histogram whose sample it is, or its own name.
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| types.get(*f).is_some_and(|t| t == "histogram")))
            .unwrap_or(name);
        if !helps.contains(family) || !types.contains_key(family) {
            fail(format!("{family} has no HELP or no TYPE before its samples"));
        }
        if family != current {
            fail(format!("a sample of {family} inside family {current}"));
        }
        if types[family] == "counter" && !(family.ends_with("_total") && value >= 0.0) {
            fail("a counter not named _total, or negative".into());
        }
        samples.push(Sample { name: name.to_string(), labels, value });
    }
    check_histograms(text, &samples, &types);
    Scrape { text: text.to_string(), samples, types }
}

/// Each histogram, per label set: buckets with ascending `le`, cumulative,
/// the last `+Inf` and equal to `_count`; a `_sum`.
fn check_histograms(text: &str, samples: &[Sample], types: &HashMap<String, String>) {
    for (family, _) in types.iter().filter(|(_, t)| *t == "histogram") {
        let mut series: HashMap<Vec<(String, String)>, Vec<(f64, f64)>> = HashMap::new();
        for s in samples.iter().filter(|s| s.name == format!("{family}_bucket")) {
            let le = parse_value(s.label("le").expect("a bucket without le")).unwrap();
            let rest: Vec<_> = s.labels.iter().filter(|(k, _)| k != "le").cloned().collect();
            series.entry(rest).or_default().push((le, s.value));
        }
        assert!(!series.is_empty(), "histogram {family} has no buckets\n{text}");
        for (labels, buckets) in series {
            let of = |suffix: &str| samples.iter().filter(|s| s.name == format!("{family}{suffix}") && s.labels == labels).map(|s| s.value).collect::<Vec<_>>();
            for w in buckets.windows(2) {
                assert!(w[0].0 < w[1].0 && w[0].1 <= w[1].1, "{family} {labels:?}: buckets not ascending and cumulative: {buckets:?}");
            }
            let last = buckets.last().unwrap();
            assert_eq!(last.0, f64::INFINITY, "{family} {labels:?}: no +Inf bucket last");
            assert_eq!(of("_count"), vec![last.1], "{family} {labels:?}: _count is not the +Inf bucket");
            assert_eq!(of("_sum").len(), 1, "{family} {labels:?}: no _sum");
        }
    }
}

/// `curl -i` on the daemon's socket (as another user with `setpriv` args).
fn curl(d: &Daemon, as_user: Option<&[&str]>, path: &str) -> Output {
    let sock = d.socket.to_str().unwrap();
    let mut argv: Vec<&str> = Vec::new();
    if let Some(setpriv) = as_user {
        argv.push("setpriv");
        argv.extend_from_slice(setpriv);
    }
    let url = format!("http://wisp{path}");
    argv.extend_from_slice(&["curl", "-sS", "-i", "--max-time", "10", "--unix-socket", sock, &url]);
    Command::new(argv[0]).args(&argv[1..]).output().unwrap()
}

/// `GET /metrics` as root: checked (200, its content type) and parsed.
fn scrape(d: &Daemon) -> Scrape {
    let o = curl(d, None, "/metrics");
    let out = String::from_utf8(o.stdout).expect("the text is UTF-8");
    assert!(o.status.success(), "curl: {out} {}", String::from_utf8_lossy(&o.stderr));
    let (head, body) = out.split_once("\r\n\r\n").expect("a head and a body");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    let ct = head.lines().find_map(|l| l.strip_prefix("Content-Type: ")).unwrap_or("");
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{head}");
    parse(body)
}

/// Send `n` UDP datagrams of `size` bytes from the daemon's namespace to
/// port 9 of `ip` (nobody listens there: the VM receives them, and sends
/// back less).
fn udp_toward(d: &Daemon, ip: &str, n: usize, size: usize) {
    let script = format!(
        "import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range({n}):
    s.sendto(b'x' * {size}, ('{ip}', 9)); time.sleep(0.001)"
    );
    d.python(&script);
}

/// A TCP round trip of `n` bytes through the echo VM at `ip`.
fn echo_through(d: &Daemon, ip: &str, n: usize) {
    let script = format!(
        "import socket, threading
s = socket.create_connection(('{ip}', 7), timeout=10)
got = [0]
def read():
    while got[0] < {n}:
        b = s.recv(65536)
        if not b: break
        got[0] += len(b)
t = threading.Thread(target=read); t.start()
s.sendall(b'y' * {n}); t.join(); print(got[0])"
    );
    let got = d.python(&script);
    assert_eq!(got.trim(), n.to_string(), "the echo VM did not echo it all");
}

#[test]
fn metrics_are_prometheus_text_of_vms_boots_pool_and_nics() {
    let gid = GROUP.to_string();
    let d = Daemon::start_in_netns("metrics", "10.77.51.0/24", &["--pool", "16M=2", "--socket-group", &gid]);
    let mut c = d.client();
    let before = scrape(&d);
    for state in ["running", "paused", "exited"] {
        assert_eq!(before.value("wisp_vms", &[("state", state)]), 0.0);
    }
    assert_eq!(before.value("wisp_pool_target_shells", &[("mem_bytes", MIB16)]), 2.0);
    assert_eq!(before.types["wisp_boot_seconds"], "histogram");
    let boots = before.value("wisp_boots_total", &[]);

    // Two VMs: an echo server with a NIC, and one that spins (CPU time at once).
    let echo = c.create(&CreateVm { image: "echo".into(), name: Some("m-echo".into()), net: true, ..Default::default() }).unwrap();
    let ip = echo.ip.clone().expect("a NIC");
    common::wait_console(&mut c, &echo.id, &format!("echo: listening on {ip}:7"));
    let spin = CreateVm { image: "hostile".into(), args: vec!["spin".into()], name: Some("m-spin".into()), timeout_ms: Some(60_000), ..Default::default() };
    let spin = c.create(&spin).unwrap();
    let ids = [(&echo.id, "m-echo"), (&spin.id, "m-spin")];
    // The echo VM's CPU time shows in clock ticks (10 ms): traffic until it does.
    fn vm(id: &str) -> [(&str, &str); 1] {
        [("vm", id)]
    }
    let m = common::eventually(Duration::from_secs(30), || "the VMs' CPU time stayed 0".into(), || {
        echo_through(&d, &ip, 1 << 20);
        let m = scrape(&d);
        ids.iter().all(|(id, _)| m.find("wisp_vm_cpu_seconds_total", &vm(id)).iter().any(|s| s.value > 0.0)).then_some(m)
    });
    let running = c.list().unwrap().iter().filter(|v| v.state == VmState::Running).count();
    assert_eq!((running, m.value("wisp_vms", &[("state", "running")])), (2, 2.0));
    assert_eq!(m.value("wisp_boots_total", &[]), boots + 2.0, "two boots counted");
    assert_eq!(m.value("wisp_boot_seconds_count", &[]), boots + 2.0);
    assert!(m.value("wisp_boot_seconds_sum", &[]) > 0.0);
    for (id, name) in ids {
        let labels = [("vm", id.as_str()), ("name", name)];
        assert!(m.value("wisp_vm_cpu_seconds_total", &labels) > 0.0, "{id}'s CPU time");
        let rss = m.value("wisp_vm_resident_memory_bytes", &labels);
        assert!(rss > 1e6 && rss < 1e9, "{id}'s resident memory: {rss}");
    }
    // The NIC: its tap's counters, named from the VM's side; the spinning VM has none.
    let tap = format!("wt{}", echo.id);
    let nic = [("vm", echo.id.as_str()), ("name", "m-echo"), ("interface", tap.as_str())];
    for metric in ["rx_bytes", "tx_bytes", "rx_packets", "tx_packets"] {
        assert!(m.value(&format!("wisp_nic_{metric}_total"), &nic) >= if metric.ends_with("bytes") { 1e6 } else { 10.0 }, "{metric}");
    }
    for metric in ["rx_dropped", "tx_dropped"] {
        m.value(&format!("wisp_nic_{metric}_total"), &nic);
    }
    assert!(m.find("wisp_nic_rx_bytes_total", &vm(&spin.id)).is_empty());
    // Datagrams toward the VM are what it received, not what it sent (its
    // answers, ICMP port unreachable, quote at most 576 bytes of each).
    udp_toward(&d, &ip, 300, 1400);
    let after = scrape(&d);
    let delta = |metric: &str| after.value(metric, &nic) - m.value(metric, &nic);
    let (rx, tx) = (delta("wisp_nic_rx_bytes_total"), delta("wisp_nic_tx_bytes_total"));
    let dropped = delta("wisp_nic_rx_dropped_total");
    assert!(rx >= 300_000.0 && tx < rx * 0.6, "420 KB toward the VM: its rx grew {rx}, its tx {tx} ({dropped} dropped)");

    // States follow the VMs.
    c.pause(&echo.id).unwrap();
    let m = scrape(&d);
    assert_eq!((m.value("wisp_vms", &[("state", "running")]), m.value("wisp_vms", &[("state", "paused")])), (1.0, 1.0));
    c.resume(&echo.id).unwrap();

    // A removed VM's series are gone; the other's stay, the boots stay counted.
    c.remove(&spin.id, true).unwrap();
    let m = scrape(&d);
    assert!(!m.text.contains(&format!("vm=\"{}\"", spin.id)), "{}", m.text);
    assert_eq!(m.value("wisp_vms", &[("state", "running")]), 1.0);
    assert_eq!(m.value("wisp_boots_total", &[]), boots + 2.0);
    assert!(m.value("wisp_vm_cpu_seconds_total", &vm(&echo.id)) > 0.0);

    // Who may scrape: whoever may list VMs (the API's group), nobody else.
    let member: &[&str] = &["--reuid", NOBODY, "--regid", NOBODY, &format!("--groups={gid}")];
    let o = curl(&d, Some(member), "/metrics");
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("HTTP/1.1 200 OK"), "{o:?}");
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = curl(&d, Some(&["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"]), "/metrics");
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("HTTP/1.1 403 Forbidden"), "{o:?}");
}

#[test]
fn the_format_checker_refuses_what_prometheus_would() {
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"q\\\"\\\\\\n\"} 1\n";
    assert_eq!(parse(ok).samples[0].label("x"), Some("q\"\\\n"));
    let bad = [
        "a_total 1\n",                                                                   // no HELP or TYPE
        "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"\\t\"} 1\n",                // a bad escape
        "# HELP a A.\n# TYPE a gauge\n# HELP b B.\n# TYPE b gauge\nb 1\na 1\n",          // a family resumed
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n", // not cumulative
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n", // count != +Inf
    ];
    for text in bad {
        assert!(std::panic::catch_unwind(|| parse(text)).is_err(), "accepted: {text}");
    }
}
