//! `wispd`: the wisp daemon. Serves the REST API on a Unix socket, keeps a
//! pool of prepared VM shells, and runs each VM in its own VMM process.
//! `wispd __worker ...` is the VMM process itself (spawned by the daemon;
//! crate `wisp-vmm-process`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use wisp_vmm_process::images::image_dirs;
use wisp_vmm_process::units::{parse_pool_target, parse_size};

mod access;
mod api;
mod cgroup;
mod daemon;
mod forward;
mod fsutil;
mod images;
mod metrics;
mod netlink;
mod pidns;
mod procfs;
mod pool;
mod signals;
mod slots;

#[derive(Parser)]
#[command(name = "wispd", version, about = "The wisp daemon")]
struct Cli {
    /// API socket.
    #[arg(long, default_value = wisp_api::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Group allowed to use the API socket (mode 0660), by name or number;
    /// if it does not exist the socket stays root-only (0600).
    #[arg(long, default_value = "wisp")]
    socket_group: String,
    /// Most API connections served at once (more are answered 503).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    max_api_connections: u32,
    /// Close an API connection idle this long between requests (e.g. 60s, 500ms).
    #[arg(long, value_parser = parse_timeout, default_value = "60s")]
    api_idle_timeout: Duration,
    /// Answer 408 to a request not received whole this long after its first byte.
    #[arg(long, value_parser = parse_timeout, default_value = "30s")]
    api_read_timeout: Duration,
    /// Drop an API connection whose peer does not take a response for this long.
    #[arg(long, value_parser = parse_timeout, default_value = "60s")]
    api_write_timeout: Duration,
    /// Most forwarded (-p) connections at once, all VMs together (more are refused).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=65536))]
    max_forward_connections: u32,
    /// Most forwarded connections at once through one forwarded port.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    max_port_connections: u32,
    /// Close a forwarded connection that moved no byte either way for this long.
    #[arg(long, value_parser = parse_timeout, default_value = "300s")]
    forward_idle_timeout: Duration,
    /// State directory (one subdirectory per VM).
    #[arg(long, default_value = wisp_api::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Ready shells to keep, as MEM=COUNT (e.g. 16M=8); repeatable.
    #[arg(long = "pool", value_parser = parse_pool, default_value = "16M=4")]
    pool: Vec<(u64, u32)>,
    /// Directory of bundled images (default: next to the binary, then the development tree).
    #[arg(long)]
    images: Option<PathBuf>,
    /// Bridge for the VMs' NICs (created if missing).
    #[arg(long, default_value = "wisp0")]
    bridge: String,
    /// VM subnet; the bridge takes its first address.
    #[arg(long, value_parser = parse_subnet, default_value = "10.99.0.0/24")]
    subnet: ([u8; 4], u8),
    /// Where VMs' links (`wisp run --link`) may have their subnets: the
    /// host routes a link's subnet through its VM, so only addresses set
    /// aside for clients behind VMs belong here, never the host's own.
    #[arg(long, value_parser = parse_subnet, default_value = "10.192.0.0/10")]
    link_subnets: ([u8; 4], u8),
    /// Most VMs running at once, created and forked (more are answered 429).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_vms: u32,
    /// Most guest RAM of all running VMs together, e.g. 64G (more is answered
    /// 507) [default: 4 × this host's RAM: guests touch little of theirs].
    #[arg(long, value_parser = parse_size)]
    max_guest_memory: Option<u64>,
    /// Most shells the pool keeps ready, all sizes together (a larger pool is answered 429).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    max_pool_shells: u32,
    /// Most bytes of images the image cache keeps (least recently used ones go first).
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    image_cache: u64,
    /// Run without control groups: no memory, pids or CPU limits for VM
    /// families (requests with `memory` or `cpus` are refused).
    #[arg(long)]
    no_cgroups: bool,
    /// Most VMs one VMM process holds. 1: a process of its own for every
    /// VM. More: VMs of one tenant (`wisp run --tenant`) and size whose
    /// image cannot fork, with no NIC and no limits of their own, share a
    /// process (and its sandbox), each still a KVM VM of its own.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    vms_per_process: u32,
    /// Recycled runs (`wisp run --recycle`) one recycling VMM process hosts
    /// at once, each on a recycler it keeps booted between runs.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    recyclers_per_process: u32,
    /// A file holding the key migrating daemons share (16 bytes or more,
    /// readable by its owner only): needed to send VMs (`wisp migrate`) and
    /// to take them.
    #[arg(long)]
    migrate_key: Option<PathBuf>,
    /// Take migrating VMs on this TCP address, ADDRESS:PORT, or Unix
    /// socket, an absolute path (needs --migrate-key).
    #[arg(long)]
    migrate_listen: Option<daemon::migrate::Addr>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// The VMM process of one VM (internal).
    #[command(name = "__worker", hide = true)]
    Worker {
        #[arg(long)]
        id: String,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        mem: u64,
        #[arg(long)]
        uid: u32,
        /// A control group of its family to join first (repeatable).
        #[arg(long = "cgroup")]
        cgroups: Vec<PathBuf>,
        /// A group VMM process hosting up to this many VMs.
        #[arg(long)]
        group: Option<u32>,
        /// The group recycles its VMs (`wisp run --recycle`).
        #[arg(long)]
        recycle: bool,
    },
    /// The init process of the VMM processes' PID namespace (internal).
    #[command(name = "__pidns", hide = true)]
    Pidns,
}

/// The migration key in `path`: 16 bytes or more, in a file no one but its
/// owner may read.
fn read_key(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(|e| format!("--migrate-key {}: {e}", path.display()))?;
    if m.mode() & 0o077 != 0 {
        return Err(format!("--migrate-key {}: readable by others (chmod 600 it)", path.display()));
    }
    let key = std::fs::read(path).map_err(|e| format!("--migrate-key {}: {e}", path.display()))?;
    let key = key.trim_ascii().to_vec();
    if key.len() < 16 {
        return Err(format!("--migrate-key {}: {} bytes, at least 16 wanted", path.display(), key.len()));
    }
    Ok(key)
}

fn parse_subnet(s: &str) -> Result<([u8; 4], u8), String> {
    let (a, p) = s.split_once('/').ok_or_else(|| format!("'{s}': expected ADDRESS/PREFIX"))?;
    let a: std::net::Ipv4Addr = a.parse().map_err(|_| format!("'{a}' is not an IPv4 address"))?;
    let p: u8 = p.parse().ok().filter(|p| (8..=30).contains(p)).ok_or_else(|| format!("'{s}': prefix must be 8..=30"))?;
    Ok((a.octets(), p))
}

/// A timeout: a number with a unit (ms, s, m), 10 ms to a day.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("'{s}': expected a duration such as 500ms, 30s or 5m"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(format!("'{s}': unknown unit '{unit}' (use ms, s or m)")),
    };
    if !(Duration::from_millis(10)..=Duration::from_secs(86_400)).contains(&d) {
        return Err(format!("'{s}': must be between 10ms and 24h"));
    }
    Ok(d)
}

fn parse_pool(s: &str) -> Result<(u64, u32), String> {
    let (mem, count) = parse_pool_target(s)?;
    Ok((wisp_vmm::check_mem_size(mem).map_err(|e| e.to_string())?, count))
}

fn main() {
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::Worker { id, dir, mem, uid, cgroups, group, recycle }) => {
            // Before anything of the VM exists: memory is charged to the
            // group of the process that first touches it.
            if let Err(e) = cgroup::join(&cgroups) {
                eprintln!("wisp-vmm {id}: {e}");
                println!("error: {e}");
                std::process::exit(1);
            }
            match group {
                Some(n) => wisp_vmm_process::group::main(&id, &dir, mem, uid, n, recycle),
                None => wisp_vmm_process::main(&id, &dir, mem, uid),
            }
        }
        Some(Cmd::Pidns) => pidns::holder_main(),
        None => {}
    }
    signals::block_term();
    raise_nofile();
    if let Err(e) = run(cli) {
        eprintln!("wispd: error: {e}");
        std::process::exit(1);
    }
}

/// One descriptor per VM (its pidfd), per API connection and two per
/// forwarded connection (both bounded): raise the open-files limit as far
/// as allowed.
fn raise_nofile() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let cur = getrlimit(Resource::Nofile);
    let want = 1 << 20;
    if setrlimit(Resource::Nofile, Rlimit { current: Some(want), maximum: Some(want) }).is_err() {
        let _ = setrlimit(Resource::Nofile, Rlimit { current: cur.maximum, maximum: cur.maximum });
    }
}

/// This host's RAM in bytes.
fn host_ram() -> u64 {
    let info = rustix::system::sysinfo();
    (info.totalram as u64).saturating_mul(u64::from(info.mem_unit))
}

/// Whether a daemon answers on `socket`. A connection alone does not
/// say so: a process that inherited a killed daemon's listener on its way
/// to `exec` (a VMM process being started) holds it for a moment, and the
/// kernel queues connections there that nobody will accept.
fn serving(socket: &std::path::Path) -> bool {
    use std::io::{Read, Write};
    let Ok(mut c) = std::os::unix::net::UnixStream::connect(socket) else { return false };
    let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(2)));
    let mut b = [0u8; 1];
    c.write_all(b"GET /v1/version HTTP/1.1\r\nHost: wispd\r\nConnection: close\r\n\r\n").is_ok() && matches!(c.read(&mut b), Ok(1))
}

fn run(cli: Cli) -> Result<(), String> {
    if let Some(parent) = cli.socket.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    if serving(&cli.socket) {
        return Err(format!("another wispd is serving {}", cli.socket.display()));
    }
    let _ = std::fs::remove_file(&cli.socket);
    // Owner-only from the start; then the group's, if it exists.
    let (listener, access, note) = access::bind(&cli.socket, &cli.socket_group)?;
    eprintln!("wispd: {note}");
    forward::configure(forward::Limits {
        max_connections: cli.max_forward_connections as usize,
        max_per_port: cli.max_port_connections as usize,
        idle_timeout: cli.forward_idle_timeout,
    });
    let api_cfg = api::Config {
        access,
        max_connections: cli.max_api_connections as usize,
        idle_timeout: cli.api_idle_timeout,
        read_timeout: cli.api_read_timeout,
        write_timeout: cli.api_write_timeout,
    };
    let quotas = daemon::Quotas {
        max_vms: cli.max_vms as usize,
        max_guest_memory: cli.max_guest_memory.unwrap_or_else(|| host_ram().saturating_mul(4)),
    };
    let has_key = cli.migrate_key.is_some();
    let cfg = daemon::Config {
        state_dir: cli.state_dir.clone(),
        image_dirs: image_dirs(cli.images),
        bridge: cli.bridge.clone(),
        subnet: cli.subnet,
        link_subnets: cli.link_subnets,
        quotas,
        max_pool_shells: cli.max_pool_shells,
        image_cache_bytes: cli.image_cache,
        cgroups: !cli.no_cgroups,
        vms_per_process: cli.vms_per_process,
        recyclers_per_process: cli.recyclers_per_process,
        migrate_key: cli.migrate_key.as_deref().map(read_key).transpose()?,
    };
    let d = daemon::Daemon::new(cfg).map_err(|e| e.to_string())?;
    for (mem, count) in &cli.pool {
        d.set_pool_target(*mem, *count).map_err(|e| format!("--pool {}M={count}: {e}", mem >> 20))?;
    }
    let (p, dd) = (d.pool.clone(), d.clone());
    std::thread::Builder::new().name("pool".into()).spawn(move || p.refill_loop(dd)).map_err(|e| e.to_string())?;
    if let Some(addr) = cli.migrate_listen {
        if has_key {
            let l = daemon::migrate::Listener::bind(&addr).map_err(|e| format!("--migrate-listen {addr}: {e}"))?;
            let dd = d.clone();
            std::thread::Builder::new().name("migrate".into()).spawn(move || dd.serve_migrations(l)).map_err(|e| e.to_string())?;
        } else {
            return Err("--migrate-listen needs --migrate-key FILE".into());
        }
    }
    let dd = d.clone();
    std::thread::Builder::new().name("watch".into()).spawn(move || dd.watch_loop()).map_err(|e| e.to_string())?;
    let (dd, sock) = (d.clone(), cli.socket.clone());
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let sig = signals::wait_term();
            // Pooled shells go; VMs keep running and are re-adopted by the
            // next wispd.
            dd.shutdown();
            let _ = std::fs::remove_file(&sock);
            eprintln!("wispd: signal {sig}: stopped (VMs keep running)");
            std::process::exit(0);
        })
        .map_err(|e| e.to_string())?;
    eprintln!("wispd: serving {} (state in {})", cli.socket.display(), cli.state_dir.display());
    api::serve(Arc::clone(&d), listener, api_cfg);
    Ok(())
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_have_units_and_bounds() {
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_timeout("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_timeout("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_timeout("5m"), Ok(Duration::from_secs(300)));
        for bad in ["", "s", "1h", "-1s", "5ms", "25h", "1441m", "99999999999999999999s"] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
    }
}
