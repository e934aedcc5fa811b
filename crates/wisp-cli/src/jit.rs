//! `wisp jit add|ls|rm`: just-in-time services (`/v1/jit`;
//! `docs/usecases.md`, "Just-in-time VMs"): wispd serves a host port, and
//! each new client address gets a VM of the image, booted by its first
//! connection and removed when idle.

use std::path::Path;
use std::time::Duration;

use clap::Subcommand;
use wisp_api::client::Client;

#[derive(Subcommand)]
pub enum JitCmd {
    /// Serve a host port with IMAGE: a client's first connection boots its
    /// VM, which serves it until idle; print the service's id.
    Add {
        /// [ADDR:]HOSTPORT:VMPORT, as `wisp run -p` takes it (host address
        /// by default 127.0.0.1).
        #[arg(long, short = 'p', value_parser = crate::units::parse_port_map)]
        port: wisp_api::PortMap,
        /// A client's VM with no connection for this long is removed.
        #[arg(long, value_parser = crate::units::parse_duration, default_value = "30s")]
        idle: Duration,
        /// Most clients' VMs at once.
        #[arg(long)]
        max_vms: Option<u32>,
        /// Guest RAM of each VM, e.g. 16M.
        #[arg(long, value_parser = crate::units::parse_mem)]
        mem: Option<u64>,
        /// Whose VMs they are.
        #[arg(long)]
        tenant: Option<String>,
        /// The image (a bundled app's name or a path).
        image: String,
        /// The VMs' arguments.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// List the services and their clients' VMs.
    Ls,
    /// Stop a service (its port closes, its VMs are removed).
    Rm {
        /// Its id.
        id: String,
    },
}

/// Run a `wisp jit` command against the daemon at `socket`.
pub fn manage(socket: &Path, cmd: JitCmd) -> Result<u8, String> {
    let mut c = Client::connect(socket).map_err(|e| format!("cannot reach wispd at {}: {e} (just-in-time services are wispd's)", socket.display()))?;
    let err = |e: wisp_api::client::ApiError| e.to_string();
    match cmd {
        JitCmd::Add { port, idle, max_vms, mem, tenant, image, args } => {
            let image = crate::remote::image_ref(&image)?;
            let j = wisp_api::AddJit { image, port, args, mem, idle_ms: Some(idle.as_millis() as u64), max_vms, tenant };
            wisp_api::action::check_jit(&j)?;
            println!("{}", c.add_jit(&j).map_err(err)?.id);
        }
        JitCmd::Ls => {
            println!("{:<12} {:<22} {:<10} {:>6} {:>7} {:>8} {:>6}", "ID", "PORT", "IMAGE", "VMS", "BOOTS", "CONNS", "FAILED");
            for j in c.jits().map_err(err)? {
                let port = format!("{}:{}:{}", j.port.host_addr(), j.port.host, j.port.vm);
                println!("{:<12} {:<22} {:<10} {:>6} {:>7} {:>8} {:>6}", j.id, port, j.image, j.clients.len(), j.boots, j.connections, j.failed);
                for cl in &j.clients {
                    println!("  {:<16} vm {} ({}) {} connections, {} open, up in {} us", cl.client, cl.vm, cl.ip, cl.connections, cl.open, cl.boot_us);
                }
            }
        }
        JitCmd::Rm { id } => c.remove_jit(&id).map_err(err)?,
    }
    Ok(0)
}
