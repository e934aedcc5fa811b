//! `wisp-oci`: wisp as an OCI runtime (issue 19; `docs/oci.md`). Engines
//! that run containers through a runtime's command line — podman (through
//! conmon), containerd's runc shim (`ctr run --runc-binary`), and so
//! Kubernetes — run a wisp image from an OCI bundle with it: `create`
//! prepares the VM in a process of its own (the container's process, whose
//! exit status is the guest's), `start` lets it run, `state`, `kill`,
//! `delete` and `features` as the runtime spec says.

mod bundle;
mod cgroup;
mod console;
mod container;
mod init;
mod log;
mod net;
mod state;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Where containers' state lives unless `--root` says.
pub const DEFAULT_ROOT: &str = "/run/wisp-oci";

#[derive(Parser)]
#[command(name = "wisp-oci", version, about = "wisp as an OCI runtime: a wisp VM per container (runtime-spec command line)")]
struct Cli {
    /// Directory for the containers' state.
    #[arg(long, global = true, default_value = DEFAULT_ROOT)]
    root: PathBuf,
    /// Write errors (and, with --debug, progress) to this file, not only stderr.
    #[arg(long, global = true)]
    log: Option<PathBuf>,
    /// The log's format: text or json (as runc writes it).
    #[arg(long = "log-format", global = true, default_value = "text")]
    log_format: String,
    /// Accepted for engines that pass it: a VM's memory is its RAM size, not a cgroup.
    #[arg(long = "systemd-cgroup", global = true)]
    systemd_cgroup: bool,
    /// Log progress too.
    #[arg(long, global = true)]
    debug: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a container from a bundle: its VM is made and waits for `start`.
    Create {
        /// The bundle's directory (config.json and the root filesystem).
        #[arg(long, short = 'b', default_value = ".")]
        bundle: PathBuf,
        /// Write the container process's pid here.
        #[arg(long = "pid-file")]
        pid_file: Option<PathBuf>,
        /// A UNIX socket to send the terminal's master to (process.terminal).
        #[arg(long = "console-socket")]
        console_socket: Option<PathBuf>,
        /// Accepted for engines that pass them (a VM has no root to pivot, no keyring).
        #[arg(long = "no-pivot", hide = true)]
        no_pivot: bool,
        #[arg(long = "no-new-keyring", hide = true)]
        no_new_keyring: bool,
        /// Descriptors past stdio to pass on: a VM takes none, so only 0.
        #[arg(long = "preserve-fds", default_value_t = 0)]
        preserve_fds: u32,
        id: String,
    },
    /// Run a created container's VM.
    Start { id: String },
    /// Print a container's state (runtime-spec JSON).
    State { id: String },
    /// Send a signal to a container's process (default SIGTERM).
    Kill {
        /// Accepted: a container has one process.
        #[arg(long, short = 'a')]
        all: bool,
        id: String,
        signal: Option<String>,
    },
    /// Remove a stopped container (with --force: whatever its state).
    Delete {
        #[arg(long, short = 'f')]
        force: bool,
        id: String,
    },
    /// Print what this runtime supports (runtime-spec features.md).
    Features,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log = log::Log::new(cli.log.clone(), &cli.log_format, cli.debug);
    let _ = cli.systemd_cgroup;
    let root = state::Root::new(&cli.root);
    let r = match cli.cmd {
        Cmd::Create { bundle, pid_file, console_socket, preserve_fds, id, no_pivot: _, no_new_keyring: _ } => {
            container::create(&root, &log, &id, &bundle, pid_file.as_deref(), console_socket.as_deref(), preserve_fds)
        }
        Cmd::Start { id } => container::start(&root, &id),
        Cmd::State { id } => container::state(&root, &id).map(|s| println!("{s}")),
        Cmd::Kill { id, signal, all: _ } => container::kill(&root, &id, signal.as_deref().unwrap_or("SIGTERM")),
        Cmd::Delete { id, force } => container::delete(&root, &id, force),
        Cmd::Features => {
            println!("{}", container::features());
            Ok(())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log.error(&e);
            ExitCode::FAILURE
        }
    }
}
