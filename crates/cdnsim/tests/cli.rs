//! The command line, end to end: a generated topology, a run, its files;
//! its plots; a malformed topology refused with its line, a missing font
//! before the run.

use std::path::PathBuf;
use std::process::Command;

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cdnsim-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cdnsim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cdnsim")).args(args).output().unwrap()
}

/// `path` is a PNG of 900 x 560 pixels with more than one colour's worth
/// of data (a plot, not an empty canvas).
fn assert_plot(path: &std::path::Path) {
    let png = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{} is no PNG", path.display());
    assert_eq!(&png[12..16], b"IHDR");
    let (w, h) = (u32::from_be_bytes(png[16..20].try_into().unwrap()), u32::from_be_bytes(png[20..24].try_into().unwrap()));
    assert_eq!((w, h), (900, 560), "{}", path.display());
    assert!(png.len() > 20_000, "{}: {} bytes, too few for axes, text and a line", path.display(), png.len());
}

#[test]
fn a_generated_topology_runs_and_writes_its_summary() {
    let d = dir("run");
    let topo = d.join("as.txt");
    let o = cdnsim(&["gen-topology", "--ases", "200", "--seed", "3", "--out", topo.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let info = cdnsim(&["info", topo.to_str().unwrap()]);
    assert_eq!(String::from_utf8_lossy(&info.stdout).trim(), "200 ASes (10 content, 35 transit, 155 access), 277 links");
    let out = d.join("run");
    let o = cdnsim(&["run", "--topology", topo.to_str().unwrap(), "--viewers", "300", "--boot-time", "0.5", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary = std::fs::read_to_string(out.join("summary.json")).unwrap();
    for field in ["\"viewers\": 300", "\"startup_delay_s\"", "\"buffering_ratio\"", "\"buffering_events\"", "\"playback_ratio\"", "\"boot_time_s\": 0.5"] {
        assert!(summary.contains(field), "{field} missing: {summary}");
    }
    let csv = std::fs::read_to_string(out.join("viewers.csv")).unwrap();
    assert_eq!(csv.lines().count(), 301);
    assert!(csv.starts_with("viewer,startup_delay_s,buffering_ratio,buffering_events,playback_ratio,started\n"));
    let caches = std::fs::read_to_string(out.join("caches.csv")).unwrap();
    let ases = std::fs::read_to_string(out.join("ases.csv")).unwrap();
    assert!(caches.starts_with("cache,peak_connections,peak_mbps\n") && caches.lines().count() > 1, "{caches}");
    assert!(ases.starts_with("as,peak_connections,peak_gbps,peak_caches\n") && ases.lines().count() > 1, "{ases}");
    assert!(summary.contains("\"per_as_peak_caches\""), "{summary}");
    let over_time = std::fs::read_to_string(out.join("caches_over_time.csv")).unwrap();
    assert!(over_time.starts_with("time_s,caches_running\n") && over_time.lines().count() > 2, "{over_time}");
    for png in ["startup_delay_cdf.png", "buffering_ratio_cdf.png", "caches_over_time.png"] {
        assert_plot(&out.join(png));
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_sweep_runs_each_boot_time_and_the_one_wisp_measured() {
    let d = dir("sweep");
    let topo = d.join("as.txt");
    assert!(cdnsim(&["gen-topology", "--ases", "150", "--out", topo.to_str().unwrap()]).status.success());
    let bench = d.join("cache.json");
    std::fs::write(&bench, r#"{"first_byte_after_run_ms": {"median": 4.6}}"#).unwrap();
    let out = d.join("sweep");
    let o = cdnsim(&["sweep", "--topology", topo.to_str().unwrap(), "--viewers", "400", "--boot-times", "0,10", "--wisp-result", bench.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv = std::fs::read_to_string(out.join("sweep.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{csv}");
    assert!(rows[0].starts_with("0,false,") && rows[1].starts_with("10,false,") && rows[2].starts_with("0.0046,true,"), "{csv}");
    let json = std::fs::read_to_string(out.join("sweep.json")).unwrap();
    assert!(json.contains("\"wisp_boot_time_s\": 0.0046"), "{json}");
    assert_plot(&out.join("sweep.png"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_malformed_topology_is_refused_with_its_line() {
    let d = dir("bad");
    let topo = d.join("bad.txt");
    std::fs::write(&topo, "# role 1 content\n1|2|-1\n2|3|2\n").unwrap();
    let o = cdnsim(&["run", "--topology", topo.to_str().unwrap(), "--out", d.join("x").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.txt: line 3: relationship '2'"), "{err}");
    let o = cdnsim(&["run", "--topology", d.join("none.txt").to_str().unwrap(), "--out", d.join("x").to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("none.txt: No such file"), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn plots_need_a_font_found_before_the_run_or_none_at_all() {
    let d = dir("font");
    let topo = d.join("as.txt");
    assert!(cdnsim(&["gen-topology", "--ases", "100", "--out", topo.to_str().unwrap()]).status.success());
    let run = |out: &str, extra: &[&str]| {
        let mut args = vec!["run", "--topology", topo.to_str().unwrap(), "--viewers", "100", "--out"];
        let out = d.join(out);
        let out = out.to_str().unwrap().to_string();
        args.push(&out);
        args.extend_from_slice(extra);
        cdnsim(&args)
    };
    // A font that is not there, or not a font: refused before simulating
    // (nothing written).
    let o = run("a", &["--font", d.join("none.ttf").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("none.ttf: No such file"), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!d.join("a").exists());
    let o = run("b", &["--font", topo.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("as.txt: not a TrueType or OpenType font"), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!d.join("b").exists());
    // No plots: the summaries, no PNG.
    let o = run("c", &["--no-plots", "--font", d.join("none.ttf").to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(d.join("c/summary.json").exists() && !d.join("c/startup_delay_cdf.png").exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_run_on_one_countrys_ases() {
    // Two countries: DE (an origin, a transit AS, two access ASes) and FR
    // (one access AS, linked to DE's transit AS).
    let d = dir("country");
    let topo = d.join("two.txt");
    std::fs::write(&topo, "# role 10 content\n# country 10 DE\n# country 1 DE\n# country 2 DE\n# country 3 DE\n# country 4 FR\n1|10|-1\n1|2|-1\n1|3|-1\n1|4|-1\n").unwrap();
    let info = cdnsim(&["info", topo.to_str().unwrap(), "--country", "DE"]);
    assert_eq!(String::from_utf8_lossy(&info.stdout).trim(), "4 ASes (1 content, 1 transit, 2 access), 3 links");
    let out = d.join("de");
    let o = cdnsim(&["run", "--topology", topo.to_str().unwrap(), "--country", "DE", "--viewers", "200", "--no-plots", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Viewers in DE's two access ASes only.
    let ases = std::fs::read_to_string(out.join("ases.csv")).unwrap();
    assert_eq!(ases.lines().count(), 3, "{ases}");
    // A generated country says so.
    let gen = d.join("gen.txt");
    assert!(cdnsim(&["gen-topology", "--ases", "100", "--country", "NL", "--out", gen.to_str().unwrap()]).status.success());
    let info = cdnsim(&["info", gen.to_str().unwrap(), "--country", "NL"]);
    assert!(String::from_utf8_lossy(&info.stdout).starts_with("100 ASes"), "{}", String::from_utf8_lossy(&info.stdout));
    let o = cdnsim(&["run", "--topology", topo.to_str().unwrap(), "--country", "IT", "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("two.txt: no AS of country IT"), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = std::fs::remove_dir_all(&d);
}
