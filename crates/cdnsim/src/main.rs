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
