//! `cdnsim`: the command line of the CDN simulator (see the crate's
//! README).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use cdnsim::topology::{Role, Speeds, Topology};

#[derive(Parser)]
#[command(name = "cdnsim", about = "A flow-level simulator of elastic CDNs (MiniCache's CDNSim)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// What `run` and `sweep` share.
#[derive(Args)]
struct Scenario {
    /// A file in CAIDA's AS-relationship format.
    #[arg(long)]
    topology: PathBuf,
    /// Only the ASes of this country and the links among them (`# country
    /// ASN CODE` lines).
    #[arg(long)]
    country: Option<String>,
    #[arg(long, default_value_t = 100_000)]
    viewers: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The origin (a content AS; the first one by default).
    #[arg(long)]
    origin: Option<u32>,
    /// Caches pull their feed from the nearest serving cache of their
    /// channel (else from the origin).
    #[arg(long)]
    cooperative: bool,
    /// A TrueType font for the plots' text (by default DejaVu Sans from
    /// fonts-dejavu-core).
    #[arg(long)]
    font: Option<PathBuf>,
    /// Write no PNG plots.
    #[arg(long)]
    no_plots: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate a synthetic AS graph (Elmokashfi et al.'s model, as
    /// networkx's random_internet_as_graph) in CAIDA's format.
    GenTopology {
        /// Number of ASes (100 to 15,000 at country scale).
        #[arg(long)]
        ases: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Mark every AS as of this country (`# country ASN CODE`), so
        /// that generated countries can be put in one file.
        #[arg(long)]
        country: Option<String>,
        /// Where to write it.
        #[arg(long)]
        out: PathBuf,
    },
    /// Simulate viewers on a topology and write their QoE.
    Run {
        #[command(flatten)]
        scenario: Scenario,
        /// Seconds from a cache's start until it serves.
        #[arg(long, default_value_t = 1.0)]
        boot_time: f64,
        /// The straightforward way, for comparison: a solver entry per
        /// stream, every rate filled from scratch after every event.
        #[arg(long)]
        naive: bool,
        /// Where to write summary.json, viewers.csv, caches.csv, ases.csv,
        /// caches_over_time.csv and the plots (startup_delay_cdf.png,
        /// buffering_ratio_cdf.png, caches_over_time.png).
        #[arg(long)]
        out: PathBuf,
    },
    /// Run the same viewers once per cache boot time (the paper's Figure 2)
    /// and write one summary of them all.
    Sweep {
        #[command(flatten)]
        scenario: Scenario,
        /// Boot times to try (seconds, comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = vec![0.0, 0.1, 0.5, 1.0, 10.0])]
        boot_times: Vec<f64>,
        /// Also the boot time wisp measured: the cache benchmark's first
        /// byte after `wisp run` (its JSON, if the file exists).
        #[arg(long, default_value = "bench/results/cache.json")]
        wisp_result: PathBuf,
        /// Where to write sweep.json, sweep.csv and sweep.png (start-up
        /// delay's CDF per boot time).
        #[arg(long)]
        out: PathBuf,
    },
    /// Read a topology and say what it holds (ASes by role, links).
    Info {
        /// A file in CAIDA's AS-relationship format.
        topology: PathBuf,
        /// Only the ASes of this country (`# country ASN CODE` lines).
        #[arg(long)]
        country: Option<String>,
    },
}

fn read(path: &PathBuf) -> Result<Topology, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Topology::parse(&text, Speeds::default()).map_err(|e| format!("{}: {e}", path.display()))
}

/// The topology of a run: the file's, or one country's part of it.
fn read_for_run(path: &PathBuf, country: Option<&str>) -> Result<Topology, String> {
    let t = read(path)?;
    let Some(cc) = country else { return Ok(t) };
    let part = t.country(cc);
    if part.ases.is_empty() {
        return Err(format!("{}: no AS of country {cc} ('# country ASN {cc}' lines)", path.display()));
    }
    Ok(part)
}

/// The origin: AS `asn`, or the first content AS.
fn origin_of(t: &Topology, asn: Option<u32>) -> Result<usize, String> {
    match asn {
        Some(asn) => t.find(asn).ok_or_else(|| format!("--origin {asn}: no such AS")),
        None => t.with_role(Role::Content).next().ok_or_else(|| "the topology has no content AS (mark one: '# role ASN content')".into()),
    }
}

fn check_boot(b: f64) -> Result<(), String> {
    if (0.0..=3600.0).contains(&b) {
        Ok(())
    } else {
        Err(format!("boot time {b}: 0 to 3600 seconds"))
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.cmd {
        Cmd::GenTopology { ases, seed, country, out } => {
            if !(5..=1_000_000).contains(&ases) {
                return Err(format!("--ases {ases}: 5 to 1,000,000"));
            }
            let mut t = cdnsim::gen::generate(ases, seed);
            if let Some(cc) = country {
                if cc.is_empty() || cc.contains(char::is_whitespace) {
                    return Err(format!("--country '{cc}': a code without spaces, like DE"));
                }
                for a in &mut t.ases {
                    a.country = Some(cc.clone());
                }
            }
            std::fs::write(&out, t.write()).map_err(|e| format!("{}: {e}", out.display()))?;
            eprintln!("{}: {} ASes, {} links", out.display(), t.ases.len(), t.links.len());
        }
        Cmd::Sweep { scenario: Scenario { topology, country, viewers, seed, origin, cooperative, font, no_plots }, mut boot_times, wisp_result, out } => {
            let t = read_for_run(&topology, country.as_deref())?;
            if !no_plots {
                cdnsim::plot::load_font(font.as_deref())?;
            }
            let o = origin_of(&t, origin)?;
            // The cache VM's first byte after `wisp run`, as measured.
            let wisp = std::fs::read_to_string(&wisp_result).ok().and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok()).and_then(|v| v["first_byte_after_run_ms"]["median"].as_f64()).map(|ms| ms / 1000.0);
            if let Some(w) = wisp {
                boot_times.push(w);
            }
            let mut rows = Vec::new();
            let mut startups: Vec<(String, Vec<f64>)> = Vec::new();
            let mut csv = String::from("boot_time_s,wisp,startup_delay_s_mean,startup_delay_s_p90,buffering_ratio_mean,buffering_events_mean,playback_ratio_mean\n");
            for &b in &boot_times {
                check_boot(b)?;
                let params = cdnsim::workload::Params { viewers, ..Default::default() };
                let cfg = cdnsim::sim::Config { boot_s: b, cooperative, ..Default::default() };
                let start = std::time::Instant::now();
                let r = cdnsim::sim::run(&t, o, &params, &cfg, seed)?;
                let mut s = cdnsim::report::summary(&r, start.elapsed().as_secs_f64(), b, seed);
                s["wisp"] = serde_json::Value::Bool(Some(b) == wisp);
                csv += &format!(
                    "{},{},{:.6},{:.6},{:.6},{:.6},{:.6}\n",
                    b,
                    Some(b) == wisp,
                    s["startup_delay_s"]["mean"].as_f64().unwrap_or(0.0),
                    s["startup_delay_s"]["p90"].as_f64().unwrap_or(0.0),
                    s["buffering_ratio"]["mean"].as_f64().unwrap_or(0.0),
                    s["buffering_events"]["mean"].as_f64().unwrap_or(0.0),
                    s["playback_ratio"]["mean"].as_f64().unwrap_or(0.0)
                );
                eprintln!("boot {b} s: start-up {:.3} s on average", s["startup_delay_s"]["mean"].as_f64().unwrap_or(0.0));
                rows.push(s);
                let name = if Some(b) == wisp { format!("{:.1} ms (wisp)", b * 1000.0) } else { format!("{b} s") };
                startups.push((name, r.qoe.iter().map(|q| q.startup_delay_s).collect()));
            }
            std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
            let doc = serde_json::json!({"topology": topology.display().to_string(), "viewers": viewers, "seed": seed, "wisp_boot_time_s": wisp, "runs": rows});
            for (name, text) in [("sweep.json", serde_json::to_string_pretty(&doc).expect("JSON")), ("sweep.csv", csv)] {
                let p = out.join(name);
                std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
            }
            if !no_plots {
                let series: Vec<(String, &[f64])> = startups.iter().map(|(n, v)| (format!("boot {n}"), &v[..])).collect();
                cdnsim::plot::cdf_plot(&out.join("sweep.png"), &format!("Start-up delay by cache boot time ({viewers} viewers)"), "start-up delay (s)", &series)?;
            }
        }
        Cmd::Run { scenario: Scenario { topology, country, viewers, seed, origin, cooperative, font, no_plots }, boot_time, naive, out } => {
            let t = read_for_run(&topology, country.as_deref())?;
            if !no_plots {
                cdnsim::plot::load_font(font.as_deref())?;
            }
            let o = origin_of(&t, origin)?;
            check_boot(boot_time)?;
            let params = cdnsim::workload::Params { viewers, ..Default::default() };
            let cfg = cdnsim::sim::Config { boot_s: boot_time, naive, cooperative, ..Default::default() };
            let start = std::time::Instant::now();
            // (On a terminal only: indicatif draws nothing elsewhere.)
            let bar = indicatif::ProgressBar::new(viewers as u64);
            bar.set_style(indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} viewers done, {elapsed} ({eta} left)").expect("a valid template"));
            let r = cdnsim::sim::run_with(&t, o, &params, &cfg, seed, |n| bar.set_position(n as u64))?;
            bar.finish_and_clear();
            let wall = start.elapsed().as_secs_f64();
            std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
            let mut csv = String::from("viewer,startup_delay_s,buffering_ratio,buffering_events,playback_ratio,started\n");
            for (i, q) in r.qoe.iter().enumerate() {
                csv += &format!("{i},{:.6},{:.6},{},{:.6},{}\n", q.startup_delay_s, q.buffering_ratio, q.buffering_events, q.playback_ratio, q.started);
            }
            let mut caches = String::from("cache,peak_connections,peak_mbps\n");
            for (i, c) in r.per_cache.iter().enumerate() {
                caches += &format!("{i},{},{:.3}\n", c.0, c.1 / 1e6);
            }
            let mut ases = String::from("as,peak_connections,peak_gbps,peak_caches\n");
            for (i, a) in r.per_as.iter().enumerate() {
                ases += &format!("{i},{},{:.6},{}\n", a.0, a.1 / 1e9, a.2);
            }
            let mut over_time = String::from("time_s,caches_running\n");
            for (t, n) in &r.caches {
                over_time += &format!("{t:.6},{n}\n");
            }
            for (name, text) in [("viewers.csv", csv), ("caches.csv", caches), ("ases.csv", ases), ("caches_over_time.csv", over_time)] {
                let p = out.join(name);
                std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
            }
            let s = serde_json::to_string_pretty(&cdnsim::report::summary(&r, wall, boot_time, seed)).expect("a JSON value");
            let json_path = out.join("summary.json");
            std::fs::write(&json_path, &s).map_err(|e| format!("{}: {e}", json_path.display()))?;
            if !no_plots {
                let startup: Vec<f64> = r.qoe.iter().map(|q| q.startup_delay_s).collect();
                let buffering: Vec<f64> = r.qoe.iter().map(|q| q.buffering_ratio).collect();
                let label = format!("boot {boot_time} s");
                cdnsim::plot::cdf_plot(&out.join("startup_delay_cdf.png"), &format!("Start-up delay ({viewers} viewers)"), "start-up delay (s)", &[(label.clone(), &startup)])?;
                cdnsim::plot::cdf_plot(&out.join("buffering_ratio_cdf.png"), &format!("Buffering ratio ({viewers} viewers)"), "time stalled / time since start", &[(label, &buffering)])?;
                cdnsim::plot::caches_plot(&out.join("caches_over_time.png"), &r.caches)?;
            }
            println!("{s}");
        }
        Cmd::Info { topology, country } => {
            let mut t = read(&topology)?;
            if let Some(cc) = country {
                t = t.country(&cc);
            }
            let n = |r| t.with_role(r).count();
            println!("{} ASes ({} content, {} transit, {} access), {} links", t.ases.len(), n(Role::Content), n(Role::Transit), n(Role::Access), t.links.len());
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cdnsim: {e}");
            ExitCode::FAILURE
        }
    }
}
