//! `cdnsim`: the command line of the CDN simulator (see the crate's
//! README).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cdnsim::topology::{Role, Speeds, Topology};

#[derive(Parser)]
#[command(name = "cdnsim", about = "A flow-level simulator of elastic CDNs (MiniCache's CDNSim)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
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
        /// Where to write it.
        #[arg(long)]
        out: PathBuf,
    },
    /// Simulate viewers on a topology and write their QoE.
    Run {
        /// A file in CAIDA's AS-relationship format.
        #[arg(long)]
        topology: PathBuf,
        #[arg(long, default_value_t = 100_000)]
        viewers: usize,
        /// Seconds from a cache's start until it serves.
        #[arg(long, default_value_t = 1.0)]
        boot_time: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The origin (a content AS; the first one by default).
        #[arg(long)]
        origin: Option<u32>,
        /// Where to write summary.json and viewers.csv.
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

fn run(cli: Cli) -> Result<(), String> {
    match cli.cmd {
        Cmd::GenTopology { ases, seed, out } => {
            if !(5..=1_000_000).contains(&ases) {
                return Err(format!("--ases {ases}: 5 to 1,000,000"));
            }
            let t = cdnsim::gen::generate(ases, seed);
            std::fs::write(&out, t.write()).map_err(|e| format!("{}: {e}", out.display()))?;
            eprintln!("{}: {} ASes, {} links", out.display(), t.ases.len(), t.links.len());
        }
        Cmd::Run { topology, viewers, boot_time, seed, origin, out } => {
            let t = read(&topology)?;
            let o = match origin {
                Some(asn) => t.find(asn).ok_or_else(|| format!("--origin {asn}: no such AS"))?,
                None => t.with_role(Role::Content).next().ok_or("the topology has no content AS (mark one: '# role ASN content')")?,
            };
            if !(0.0..=3600.0).contains(&boot_time) {
                return Err(format!("--boot-time {boot_time}: 0 to 3600 seconds"));
            }
            let params = cdnsim::workload::Params { viewers, ..Default::default() };
            let cfg = cdnsim::sim::Config { boot_s: boot_time, ..Default::default() };
            let start = std::time::Instant::now();
            let r = cdnsim::sim::run(&t, o, &params, &cfg, seed)?;
            let wall = start.elapsed().as_secs_f64();
            std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
            let mut csv = String::from("viewer,startup_delay_s,buffering_ratio,buffering_events,playback_ratio,started\n");
            for (i, q) in r.qoe.iter().enumerate() {
                csv += &format!("{i},{:.6},{:.6},{},{:.6},{}\n", q.startup_delay_s, q.buffering_ratio, q.buffering_events, q.playback_ratio, q.started);
            }
            let csv_path = out.join("viewers.csv");
            std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;
            let s = serde_json::to_string_pretty(&cdnsim::report::summary(&r, wall, boot_time, seed)).expect("a JSON value");
            let json_path = out.join("summary.json");
            std::fs::write(&json_path, &s).map_err(|e| format!("{}: {e}", json_path.display()))?;
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
