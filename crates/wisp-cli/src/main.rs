//! `wisp`: run and manage unikernel VMs. Talks to `wispd` over its API
//! socket; `wisp run` and `wisp inspect IMAGE` also work without a daemon.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod app;
mod direct;
mod functions;
mod guestio;
mod jit;
mod libs;
mod recycler;
mod remote;
mod shfs;
mod units;

/// Exit status when wisp itself cannot do what was asked.
pub use wisp_vmm_process::exit::ERROR as EXIT_ERROR;

#[derive(Parser)]
#[command(name = "wisp", version, about = "Boot and manage unikernel VMs, light and quick as processes")]
struct Cli {
    /// wispd's API socket [env: WISP_SOCKET; default /run/wisp/wispd.sock].
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
pub struct RunArgs {
    /// Detach: print the VM's id and return (needs wispd).
    #[arg(short, long)]
    pub detach: bool,
    /// Give the VM a unique name (needs wispd).
    #[arg(long)]
    pub name: Option<String>,
    /// Start this many VMs (with -d).
    #[arg(long)]
    pub count: Option<u32>,
    /// Guest RAM, e.g. 16M, 1G (rounded up to 2 MiB).
    #[arg(long, value_parser = units::parse_mem)]
    pub mem: Option<u64>,
    /// End the VM after this long, e.g. 1s, 500ms.
    #[arg(long, value_parser = units::parse_duration)]
    pub timeout: Option<Duration>,
    /// Print timings of each boot phase to stderr.
    #[arg(long)]
    pub stats: bool,
    /// Whose VM it is (1-64 of [A-Za-z0-9_.-]): under wispd
    /// --vms-per-process, only VMs of one tenant share a VMM process.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Most VMs in the VM's family (itself, its children, theirs, ...; at
    /// most 64, the default); a fork beyond it fails with EAGAIN.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=wisp_api::MAX_FAMILY as i64))]
    pub family_limit: Option<u32>,
    /// Memory limit of the VM's family (guest RAM, monitors, what its forked
    /// VMs copy), e.g. 256M; past it the family meets the OOM killer, alone
    /// (needs wispd) [default: room for every VM the family may hold].
    #[arg(long, value_parser = units::parse_mem)]
    pub memory: Option<u64>,
    /// CPU quota of the VM's family in CPUs, e.g. 0.5 or 2 (needs wispd)
    /// [default: no quota, a fair share].
    #[arg(long, value_parser = units::parse_cpus)]
    pub cpus: Option<f64>,
    /// Give the VM a NIC on wispd's bridge with an address from its subnet.
    #[arg(long, conflicts_with = "tap")]
    pub net: bool,
    /// Forward a host TCP port to the VM, [ADDR:]HOSTPORT:VMPORT: on 127.0.0.1
    /// unless ADDR says otherwise (0.0.0.0: every address) (implies --net; repeatable).
    #[arg(short = 'p', long = "publish", value_parser = units::parse_port_map, conflicts_with = "tap")]
    pub ports: Vec<wisp_api::PortMap>,
    /// Limit the NIC's traffic in each direction to BYTES[/FRAMES] per
    /// second, e.g. 1M or 10M/2000 (with --net, -p or --tap).
    #[arg(long, value_parser = wisp_vmm_process::units::parse_net_rate)]
    pub net_rate: Option<wisp_vmm::NetRate>,
    /// Let the VM talk to the other VMs on wispd's bridge: its bridge port
    /// is not isolated (with --net or -p). Without it the VM reaches only
    /// the gateway and VMs started with --net-peers.
    #[arg(long, conflicts_with = "tap")]
    pub net_peers: bool,
    /// A further link (implies --net; repeatable): a NIC whose host end is
    /// moved into network namespace NETNS (named IFNAME there, default
    /// eth0), the VM having ADDRESS on it; the host routes the link's
    /// subnet through the VM — a personal firewall's client link.
    #[arg(long = "link", value_name = "NETNS[:IFNAME]=ADDRESS/N", value_parser = units::parse_link, conflicts_with = "tap")]
    pub links: Vec<wisp_api::LinkSpec>,
    /// Connect a NIC to this tap device (without wispd; needs --ip).
    #[arg(long, requires = "ip")]
    pub tap: Option<String>,
    /// The NIC's IPv4 address and prefix, e.g. 10.77.0.2/24.
    #[arg(long, value_parser = units::parse_ipv4_cidr, requires = "tap")]
    pub ip: Option<([u8; 4], u8)>,
    /// The NIC's IPv4 gateway.
    #[arg(long, value_parser = units::parse_ipv4, requires = "tap")]
    pub gw: Option<[u8; 4]>,
    /// The NIC's MAC address (default: derived from the IP address).
    #[arg(long, value_parser = units::parse_mac, requires = "tap")]
    pub mac: Option<[u8; 6]>,
    /// Set an environment variable of the guest: KEY=VALUE, or KEY for
    /// this shell's value (repeatable; the guest reads `wisp::env::var`).
    #[arg(short = 'e', long = "env")]
    pub env: Vec<String>,
    /// Read environment variables from a file of KEY=VALUE lines (blank
    /// lines and # comments skipped; repeatable, before -e).
    #[arg(long)]
    pub env_file: Vec<PathBuf>,
    /// Give the guest a read-only file, HOST:GUEST with GUEST an absolute
    /// path (repeatable; the guest reads `wisp::fs::read`). Through wispd
    /// at most 512 KiB of files in all.
    #[arg(long = "file", value_parser = guestio::parse_file_map)]
    pub files: Vec<(PathBuf, String)>,
    /// Give the guest a disk backed by FILE (a file or block device whose
    /// size is a whole number of 4 KiB sectors), read-write or with `:ro`
    /// read-only (repeatable; the guest reads `wisp::blk`). Many VMs may
    /// share one volume read-only.
    #[arg(long = "volume", value_parser = guestio::parse_volume)]
    pub volumes: Vec<(PathBuf, bool)>,
    /// Map the shared library FILE (NAME.so, from `make libs`) for the
    /// guest, which finds it by NAME (`wisp::lib`); checked and its
    /// signature verified first (repeatable; without wispd for now;
    /// docs/libraries.md).
    #[arg(long = "lib", value_name = "FILE")]
    pub libs: Vec<PathBuf>,
    /// Keep standard input open: the guest reads what this process reads
    /// (`wisp::stdin`); without it the guest's input is empty.
    #[arg(short = 'i', long)]
    pub interactive: bool,
    /// Make a template of this name instead of a VM (with wispd): boot
    /// IMAGE, save it when its guest says it is ready (`wisp::ready`),
    /// and print what was saved. `wisp run --from NAME` starts VMs from it.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["from", "detach", "count"])]
    pub template: Option<String>,
    /// Run the application library FILE (APP.so, e.g. build/libs/hello.so)
    /// in a VM that loads it and calls its entry (the `recycler` image;
    /// no IMAGE): `wisp run --recycle APP.so -- ARGS` (docs/libraries.md).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["from", "template"])]
    pub recycle: Option<PathBuf>,
    /// Set from `--recycle`: through wispd, the run goes to a recycled VM.
    #[arg(skip)]
    pub recycled: bool,
    /// Start the VM from template NAME (with wispd; no IMAGE): it goes on
    /// from where the template's guest said it was ready.
    #[arg(long, value_name = "NAME")]
    pub from: Option<String>,
    /// Path of an image, the name of a bundled app, or an app's crate
    /// directory (built first, as by `wisp build`). Not with --from.
    #[arg(default_value = "", hide_default_value = true)]
    pub image: String,
    /// Arguments passed to the guest.
    #[arg(last = true)]
    pub args: Vec<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Boot IMAGE in a new VM; attached, its console goes to stdout and its
    /// exit code becomes wisp's. Uses wispd if it is running, else boots the
    /// VM in this process.
    Run(RunArgs),
    /// List VMs.
    Ps {
        /// Include exited VMs.
        #[arg(short, long)]
        all: bool,
        /// Print ids only.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Show a VM (by id or name), or, without a daemon or a matching VM, an
    /// image's entry point, segments, sizes and ABI version.
    Inspect {
        /// VM id, id prefix or name; or an image.
        target: String,
    },
    /// Print a VM's console output (standard output, or standard error).
    Logs {
        /// Keep printing new output until the VM ends.
        #[arg(short, long)]
        follow: bool,
        /// Its standard error instead (printed on stdout).
        #[arg(long)]
        stderr: bool,
        /// VM id or name.
        vm: String,
    },
    /// Ask VMs to stop, then kill them after a grace period.
    Stop {
        /// Grace period, e.g. 2s.
        #[arg(long, value_parser = units::parse_duration, default_value = "2s")]
        grace: Duration,
        /// VM ids or names.
        #[arg(required = true)]
        vms: Vec<String>,
    },
    /// Stop VMs at once.
    Kill {
        /// VM ids or names.
        #[arg(required = true)]
        vms: Vec<String>,
    },
    /// Pause VMs.
    Pause {
        /// VM ids or names.
        #[arg(required = true)]
        vms: Vec<String>,
    },
    /// Resume paused VMs.
    Resume {
        /// VM ids or names.
        #[arg(required = true)]
        vms: Vec<String>,
    },
    /// Wait for a VM to end; exit with its status.
    Wait {
        /// VM id or name.
        vm: String,
    },
    /// Remove VMs (exited ones, or running ones with -f).
    Rm {
        /// Kill running VMs first.
        #[arg(short, long)]
        force: bool,
        /// Remove every VM.
        #[arg(long, conflicts_with = "vms")]
        all: bool,
        /// Remove each VM's whole family (with -f, all its VMs are killed at
        /// once: none forks meanwhile).
        #[arg(long, conflicts_with = "all")]
        family: bool,
        /// VM ids or names.
        #[arg(required_unless_present = "all")]
        vms: Vec<String>,
    },
    /// Save a running (or paused) VM into FILE: its vCPU, devices and the
    /// memory it touched. The VM goes on unless --stop.
    Snapshot {
        /// Stop the VM once it is saved.
        #[arg(long)]
        stop: bool,
        /// Only the pages written since the VM's last snapshot (restore it
        /// with `wisp restore --base LAST ... FILE`).
        #[arg(long)]
        incremental: bool,
        /// VM id or name.
        vm: String,
        /// The snapshot file to write (created with your rights, mode 0600).
        file: PathBuf,
    },
    /// Replace one of a running VM's shared libraries (live update): the
    /// new library is checked against the old one, mapped beside it, and
    /// switched at the guest's next point where it runs no library code,
    /// with the old one's variables carried over. On any failure the VM
    /// runs the old library.
    Update {
        /// The library to replace, by name (default: NEW's file stem).
        #[arg(long)]
        replace: Option<String>,
        /// Longest wait for the guest, in ms.
        #[arg(long, default_value_t = 5000)]
        wait: u64,
        /// VM id or name.
        vm: String,
        /// The new library (`.so`).
        new: PathBuf,
    },
    /// Move a VM to another daemon (`wispd --migrate-listen` there; both
    /// with the same --migrate-key): it goes on there with its address,
    /// and here it ends. On any failure it runs on here.
    Migrate {
        /// The other daemon's migration address: ADDRESS:PORT, or the
        /// absolute path of its Unix socket.
        #[arg(long)]
        to: String,
        /// VM id or name.
        vm: String,
    },
    /// Start a new VM from a snapshot: it goes on from where it was saved
    /// (a new VM each time; prints its id).
    Restore {
        /// Name the new VM.
        #[arg(long)]
        name: Option<String>,
        /// A snapshot FILE is laid over when it is incremental: its full
        /// base first, then each increment before FILE (repeatable).
        #[arg(long = "base", value_name = "SNAPSHOT")]
        bases: Vec<PathBuf>,
        /// The volume of the saved VM's next disk, FILE[:ro] as it was
        /// given (a disk's contents are not in a snapshot; repeatable, in
        /// the disks' order).
        #[arg(long = "volume", value_parser = guestio::parse_volume)]
        volumes: Vec<(PathBuf, bool)>,
        /// The snapshot file.
        file: PathBuf,
    },
    /// Make an app: a crate from the library OS's template that builds
    /// anywhere (`wisp run PATH` builds and boots it).
    New {
        /// A TCP server (a NIC in its manifest) instead of a hello app.
        #[arg(long)]
        net: bool,
        /// The app's directory; its last component is the app's name.
        path: PathBuf,
    },
    /// Build an app's crate for the guest target and print the image's path.
    Build {
        /// The crate's directory.
        #[arg(default_value = ".")]
        path: PathBuf,
    },
    /// Make and fill SHFS volumes for the content cache (docs/shfs.md).
    Shfs {
        #[command(subcommand)]
        cmd: shfs::ShfsCmd,
    },
    /// Guest shared libraries: keys, signing, inspection (docs/libraries.md).
    Lib {
        #[command(subcommand)]
        cmd: libs::LibCmd,
    },
    /// Recycler endpoints: application libraries kept booted for `wisp run
    /// --recycle` (docs/libraries.md).
    Recycler {
        #[command(subcommand)]
        cmd: recycler::RecyclerCmd,
    },
    /// A functions service: registered functions called over HTTP, each
    /// call in a VM of its own (docs/usecases.md).
    Fn {
        #[command(subcommand)]
        cmd: functions::FnCmd,
    },
    /// Just-in-time services: a host port served by a VM per client,
    /// booted by its first connection (docs/usecases.md).
    Jit {
        #[command(subcommand)]
        cmd: jit::JitCmd,
    },
    /// Show or set the pool of prepared shells.
    Pool {
        /// Keep COUNT shells of MEM ready, as MEM=COUNT (e.g. 16M=8).
        #[arg(long)]
        set: Vec<String>,
    },
}

/// CLOCK_MONOTONIC in ns.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn socket_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| std::env::var_os(wisp_api::SOCKET_ENV).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(wisp_api::DEFAULT_SOCKET))
}

/// Parse the command line. Help for `run` lists the bundled apps found;
/// an argument after `run`'s image suggests the `--` it needs.
fn parse() -> Cli {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut cmd = Cli::command();
    if argv.iter().any(|a| a == "-h" || a == "--help" || a == "help") {
        let apps = wisp_vmm_process::images::bundled();
        let list = if apps.is_empty() { "none built: run `make`".to_string() } else { apps.join(", ") };
        cmd = cmd.mut_subcommand("run", |c| c.after_help(format!("Bundled apps (by name as IMAGE): {list}")));
    }
    let err = match cmd.try_get_matches_from_mut(&argv).and_then(|m| Cli::from_arg_matches(&m)) {
        Ok(cli) => return cli,
        Err(e) => e,
    };
    let unexpected = match err.get(clap::error::ContextKind::InvalidArg) {
        Some(clap::error::ContextValue::String(a)) if err.kind() == clap::error::ErrorKind::UnknownArgument => Some(a.clone()),
        _ => None,
    };
    let in_run = argv.iter().skip(1).any(|a| a == "run");
    let _ = err.print();
    // (An unknown option is clap's to explain; a word after the image is
    // an argument for the guest.)
    if let (Some(arg), true) = (unexpected.filter(|a| !a.starts_with('-')), in_run) {
        if let Some(at) = argv.iter().position(|a| a.to_string_lossy() == arg) {
            let mut fixed: Vec<String> = argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
            fixed[0] = "wisp".into();
            fixed.insert(at, "--".into());
            eprintln!("\nArguments for the guest go after `--`: {}", fixed.join(" "));
        }
    }
    std::process::exit(err.exit_code())
}

/// `wisp run`: through wispd if it is there, else in this process.
fn run(mut a: RunArgs, socket: &std::path::Path, t_main: u64) -> Result<(u8, Option<wisp_vmm::Vm>), String> {
    if let Some(app) = a.recycle.take() {
        if !a.image.is_empty() {
            return Err("--recycle runs an application library: give no IMAGE".into());
        }
        // The `recycler` image, given the library, finds it by its name.
        let name = app.file_stem().and_then(|s| s.to_str()).ok_or_else(|| format!("--recycle {}: not a library's file name", app.display()))?;
        a.args.insert(0, name.to_string());
        a.image = "recycler".into();
        a.libs.push(app);
        a.recycled = true;
    }
    match a {
        a if a.image.is_empty() && a.from.is_none() => Err("an IMAGE to run is needed (or --from TEMPLATE)".into()),
        a if !a.image.is_empty() && a.from.is_some() => Err("--from starts a template's VM: give no IMAGE".into()),
        a if (a.template.is_some() || a.from.is_some()) && wisp_api::client::Client::connect(socket).is_err() => {
            Err(format!("templates are wispd's: --template and --from need it (cannot reach {})", socket.display()))
        }
        a if a.net_rate.is_some() && a.tap.is_none() && !a.net && a.ports.is_empty() => {
            Err("--net-rate limits a NIC: give the VM one with --net, -p or --tap".into())
        }
        a if a.net_peers && !a.net && a.ports.is_empty() => {
            Err("--net-peers opens a NIC's bridge port to the other VMs: give the VM one with --net or -p".into())
        }
        a => match wisp_api::client::Client::connect(&socket) {
            Ok(_) if a.tap.is_some() => Err("--tap boots the VM in this process: not with wispd (unset WISP_SOCKET or use --socket to a path without a daemon)".into()),
            Ok(c) => remote::run(c, &a, socket).map(|c| (c, None)),
            Err(e) if a.detach || a.name.is_some() || a.count.is_some() => {
                Err(format!("cannot reach wispd at {}: {e} (start it with `wispd`)", socket.display()))
            }
            Err(e) if a.net || !a.ports.is_empty() || !a.links.is_empty() => Err(format!("--net and --link need wispd (cannot reach {}: {e}); without it use --tap", socket.display())),
            // The limits are control groups, which wispd makes and removes
            // with each family; a VM in this process has none.
            Err(e) if a.memory.is_some() || a.cpus.is_some() => Err(format!(
                "--memory and --cpus need wispd, which contains each VM family in a control group (cannot reach {}: {e}); \
                 without it, limit this process itself (e.g. systemd-run --scope -p MemoryMax=256M -p CPUQuota=50% wisp run ...)",
                socket.display()
            )),
            Err(_) => direct::run(&a, t_main),
        },
    }
}

fn main() -> ExitCode {
    let t_main = monotonic_ns();
    let cli = parse();
    let socket = socket_path(cli.socket);
    let r = match cli.cmd {
        Cmd::New { net, path } => app::new(&path, net).map(|msg| {
            println!("{msg}");
            (0, None)
        }),
        Cmd::Shfs { cmd } => shfs::run(cmd).map(|c| (c, None)),
        Cmd::Lib { cmd } => libs::run(cmd).map(|c| (c, None)),
        Cmd::Recycler { cmd } => recycler::manage(&socket, cmd).map(|c| (c, None)),
        Cmd::Jit { cmd } => jit::manage(&socket, cmd).map(|c| (c, None)),
        Cmd::Fn { cmd } => functions::run(&socket, cmd).map(|c| (c, None)),
        Cmd::Build { path } => app::build(&path).map(|image| {
            println!("{}", image.display());
            (0, None)
        }),
        Cmd::Run(mut a) if app::is_crate_path(&a.image) => match app::build(std::path::Path::new(&a.image)) {
            Ok(image) => {
                a.image = image.display().to_string();
                run(a, &socket, t_main)
            }
            Err(e) => Err(e),
        },
        Cmd::Run(a) => run(a, &socket, t_main),
        Cmd::Inspect { target } => match remote::inspect(&socket, &target) {
            Some(r) => r.map(|c| (c, None)),
            None => direct::inspect(&target).map(|c| (c, None)),
        },
        cmd => remote::manage(&socket, cmd).map(|c| (c, None)),
    };
    match r {
        // A VM ran in this process: exit now and let a detached child
        // destroy it (unless WISP_SYNC_TEARDOWN is set, to measure teardown).
        Ok((code, Some(_vm))) if std::env::var_os("WISP_SYNC_TEARDOWN").is_none() => {
            wisp_vmm::detach::exit_detaching_teardown(code as i32)
        }
        Ok((code, _)) => ExitCode::from(code),
        Err(msg) => {
            eprintln!("wisp: error: {msg}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}
