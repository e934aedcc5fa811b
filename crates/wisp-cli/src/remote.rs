//! Commands that talk to wispd.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use wisp_api::client::{ApiError, Client};
use wisp_api::{CreateVm, PoolInfo, PoolTarget, VmInfo, VmState};

use crate::{Cmd, RunArgs, EXIT_ERROR};

fn connect(socket: &Path) -> Result<Client, String> {
    Client::connect(socket).map_err(|e| format!("cannot reach wispd at {}: {e} (start it with `wispd`)", socket.display()))
}

fn err(e: ApiError) -> String {
    e.to_string()
}

fn progress(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{spinner} [{bar:40}] {pos}/{len} {msg} {per_sec} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// The image as the daemon should see it: bundled names pass through,
/// paths become absolute.
pub fn image_ref(image: &str) -> Result<String, String> {
    let p = Path::new(image);
    if image.contains('/') || p.exists() {
        return std::fs::canonicalize(p)
            .map(|a| a.display().to_string())
            .map_err(|e| format!("cannot read image {image}: {e}"));
    }
    Ok(image.to_string())
}

/// `wisp run` through the daemon.
pub fn run(mut c: Client, a: &RunArgs, socket: &Path) -> Result<u8, String> {
    // A recycled run of a library the caller keeps an endpoint for goes
    // straight to it (its arguments after the app's name).
    if a.recycled {
        let lib = a.libs.first().and_then(|l| std::path::absolute(l).ok()).map(|l| l.display().to_string()).unwrap_or_default();
        if let Some(endpoint) = crate::recycler::endpoint_for(&mut c, a, &lib) {
            return crate::recycler::run_at(&endpoint, &a.args[1..], a.timeout);
        }
    }
    if let Some(name) = &a.template {
        let t = wisp_api::CreateTemplate {
            name: name.clone(),
            image: image_ref(&a.image)?,
            args: a.args.clone(),
            mem: a.mem,
            timeout_ms: a.timeout.map(|t| t.as_millis() as u64),
        };
        let t = c.make_template(&t).map_err(err)?;
        println!("template {}: {} KiB ({} KiB of memory), made in {:.1} ms", t.name, t.bytes >> 10, t.ram_bytes >> 10, t.made_us as f64 / 1e3);
        return Ok(0);
    }
    let over = |n| wisp_api::action::LimitError::Files(n as usize).to_string();
    let files = crate::guestio::files(a, wisp_api::MAX_FILE_BYTES as u64, &over)?.iter().map(|(p, d)| wisp_api::GuestFile::new(p, d)).collect();
    let req = CreateVm {
        image: match &a.from {
            Some(t) => t.clone(),
            None => image_ref(&a.image)?,
        },
        from: a.from.clone(),
        bases: Vec::new(),
        args: a.args.clone(),
        mem: a.mem,
        name: a.name.clone(),
        timeout_ms: a.timeout.map(|t| t.as_millis() as u64),
        net: a.net,
        ports: a.ports.clone(),
        net_rate: a.net_rate.map(|r| wisp_api::NetRate { bytes_per_sec: r.tx.bytes, frames_per_sec: r.tx.ops }),
        net_peers: a.net_peers,
        links: a.links.clone(),
        memory: a.memory,
        cpus: a.cpus,
        family_limit: a.family_limit,
        tenant: a.tenant.clone(),
        env: crate::guestio::env(a)?,
        files,
        stdin: a.interactive,
        // The daemon opens them, with this user's rights: absolute paths.
        volumes: a
            .volumes
            .iter()
            .map(|(p, ro)| {
                let abs = std::path::absolute(p).map_err(|e| format!("volume {}: {e}", p.display()))?;
                Ok(wisp_api::Volume { path: abs.display().to_string(), read_only: *ro })
            })
            .collect::<Result<_, String>>()?,
        restore: None,
        recycle: a.recycled,
        // The daemon opens them, with this user's rights: absolute paths.
        libs: a.libs.iter().map(|p| std::path::absolute(p).map(|p| p.display().to_string()).map_err(|e| format!("--lib {}: {e}", p.display()))).collect::<Result<_, String>>()?,
    };
    wisp_api::action::check_limits(&req).map_err(|e| e.to_string())?;
    if let Some(n) = a.count {
        if !a.detach {
            return Err("--count needs -d (detached)".into());
        }
        return run_many(c, req, n);
    }
    if a.detach && a.interactive {
        return Err("-i sends this terminal's input to an attached VM: not with -d".into());
    }
    if a.detach {
        let vm = c.create(&req).map_err(err)?;
        println!("{}", vm.id);
        return Ok(0);
    }
    let t = Instant::now();
    let mut first: Option<f64> = None;
    let mut out = std::io::stdout().lock();
    // Standard error comes on a connection of its own, followed from its
    // start as soon as the VM's id is known, until the VM ends.
    let mut errors = None;
    let id = c
        .create_attached_with(
            &req,
            &mut |id| {
                errors = Some(follow_stderr(socket, id));
                if a.interactive {
                    send_stdin(socket, id);
                }
            },
            &mut |d| {
                first.get_or_insert_with(|| t.elapsed().as_secs_f64() * 1e3);
                out.write_all(d).and_then(|_| out.flush()).is_ok()
            },
        )
        .map_err(err)?;
    let exit = c.wait(&id).map_err(err)?;
    if let Some(t) = errors {
        let _ = t.join();
    }
    if a.stats {
        let vm = c.get(&id).map_err(err)?;
        eprintln!(
            "wisp: VM {id}: first output {:.3} ms after the request (execute phase {} µs)",
            first.unwrap_or(f64::NAN),
            vm.boot_us.unwrap_or(0)
        );
    }
    if exit.code == 124 || exit.code >= 128 && exit.reason != "exited" {
        eprintln!("wisp: VM stopped: {}", exit.reason);
    }
    Ok(exit.code as u8)
}

/// Send our standard input to VM `id`'s, on a thread (left blocked in a
/// read if the VM ends first: this process ends then too).
fn send_stdin(socket: &Path, id: &str) {
    let (socket, id) = (socket.to_path_buf(), id.to_string());
    std::thread::spawn(move || {
        let conn = Client::connect(&socket).map_err(|e| e.to_string()).and_then(|mut c| c.open_stdin(&id).map_err(|e| e.to_string()));
        let mut conn = match conn {
            Ok(conn) => conn,
            // (A VM that ended first needs no input.)
            Err(e) if e.contains("has exited") => return,
            Err(e) => return eprintln!("wisp: standard input: {e}"),
        };
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut conn);
        let _ = conn.shutdown(std::net::Shutdown::Write);
    });
}

/// Copy VM `id`'s standard error to ours until the VM ends, on a thread.
fn follow_stderr(socket: &Path, id: &str) -> std::thread::JoinHandle<()> {
    let (socket, id) = (socket.to_path_buf(), id.to_string());
    std::thread::spawn(move || {
        let Ok(mut c) = Client::connect(&socket) else { return };
        let mut err = std::io::stderr();
        let _ = c.logs_stderr(&id, true, &mut |d| err.write_all(d).is_ok());
    })
}

fn run_many(mut c: Client, req: CreateVm, n: u32) -> Result<u8, String> {
    let pb = progress(n as u64, "VMs started");
    let t = Instant::now();
    let mut failed = 0u32;
    let mut first_err = None;
    for i in 0..n {
        let mut r = req.clone();
        if let Some(name) = &req.name {
            r.name = Some(format!("{name}-{}", i + 1));
        }
        match c.create(&r) {
            Ok(vm) => pb.suspend(|| println!("{}", vm.id)),
            Err(e) => {
                failed += 1;
                first_err.get_or_insert_with(|| e.to_string());
            }
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "started {} of {n} VMs in {secs:.2} s ({:.2} ms/VM){}",
        n - failed,
        secs * 1e3 / n.max(1) as f64,
        first_err.map(|e| format!("; {failed} failed, first error: {e}")).unwrap_or_default()
    );
    Ok(if failed > 0 { EXIT_ERROR } else { 0 })
}

/// `wisp inspect` of a VM; None if there is no daemon or no such VM.
pub fn inspect(socket: &Path, target: &str) -> Option<Result<u8, String>> {
    let mut c = Client::connect(socket).ok()?;
    match c.get(target) {
        Ok(vm) => {
            println!("{}", serde_json::to_string_pretty(&vm).unwrap_or_default());
            Some(Ok(0))
        }
        Err(ApiError::Status(404, _)) => None,
        Err(e) => Some(Err(err(e))),
    }
}

fn state(vm: &VmInfo) -> String {
    match (&vm.state, &vm.exit) {
        (VmState::Exited, Some(x)) if x.reason == "exited" => format!("exited ({})", x.code),
        (VmState::Exited, Some(x)) => format!("exited ({}): {}", x.code, x.reason),
        (s, _) => format!("{s:?}").to_lowercase(),
    }
}

fn ps(c: &mut Client, all: bool, quiet: bool) -> Result<u8, String> {
    let vms: Vec<VmInfo> = c.list().map_err(err)?.into_iter().filter(|v| all || v.state != VmState::Exited).collect();
    if quiet {
        vms.iter().for_each(|v| println!("{}", v.id));
        return Ok(0);
    }
    println!(
        "{:<12}  {:<16}  {:<12}  {:>5}  {:>8}  {:>8}  {:<15}  {:<12}  {}",
        "ID", "NAME", "IMAGE", "MEM", "PID", "BOOT", "IP", "PARENT", "STATE"
    );
    for v in &vms {
        let image = Path::new(&v.image).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        println!(
            "{:<12}  {:<16}  {:<12}  {:>4}M  {:>8}  {:>8}  {:<15}  {:<12}  {}",
            v.id,
            v.name.as_deref().unwrap_or("-"),
            image,
            v.mem >> 20,
            v.pid,
            v.boot_us.map(|u| format!("{u}µs")).unwrap_or_else(|| "-".into()),
            v.ip.as_deref().unwrap_or("-"),
            v.parent.as_deref().unwrap_or("-"),
            state(v)
        );
    }
    Ok(0)
}

/// Apply `f` to each VM; print its id on success, an error line otherwise.
fn each(vms: &[String], mut f: impl FnMut(&str) -> Result<(), ApiError>) -> Result<u8, String> {
    let mut code = 0;
    for v in vms {
        match f(v) {
            Ok(()) => println!("{v}"),
            Err(e) => {
                eprintln!("wisp: error: {v}: {e}");
                code = EXIT_ERROR;
            }
        }
    }
    Ok(code)
}

/// VMs named per batch removal request (the API takes up to
/// `wisp_api::MAX_REMOVE`): a progress bar moves between them.
const RM_BATCH: usize = 256;

/// Remove the VMs named, in batches: each name removed is printed, each
/// one that could not be is an error line.
fn rm_many(c: &mut Client, vms: &[String], force: bool) -> Result<u8, String> {
    let mut code = 0;
    for batch in vms.chunks(RM_BATCH) {
        let r = c.remove_many(batch, force).map_err(err)?;
        for v in batch {
            match r.failed.iter().find(|f| &f.vm == v) {
                Some(f) => {
                    eprintln!("wisp: error: {v}: {}", f.error);
                    code = EXIT_ERROR;
                }
                None => println!("{v}"),
            }
        }
    }
    Ok(code)
}

fn rm_all(c: &mut Client, force: bool) -> Result<u8, String> {
    let vms = c.list().map_err(err)?;
    let pb = progress(vms.len() as u64, "VMs removed");
    let t = Instant::now();
    let skipped = vms.iter().filter(|v| v.state != VmState::Exited && !force).count();
    let ids: Vec<String> = vms.iter().filter(|v| v.state == VmState::Exited || force).map(|v| v.id.clone()).collect();
    let (mut removed, mut failed) = (0, 0);
    for batch in ids.chunks(RM_BATCH) {
        let r = c.remove_many(batch, force).map_err(err)?;
        removed += r.removed.len();
        // A VM that went meanwhile (removed by someone else) is no failure.
        failed += r.failed.iter().filter(|f| !(f.error.starts_with("no such VM") || f.error.ends_with("was removed"))).count();
        pb.inc(batch.len() as u64);
    }
    pb.finish_and_clear();
    eprintln!(
        "removed {removed} of {} VMs in {:.2} s{}{}",
        vms.len(),
        t.elapsed().as_secs_f64(),
        if skipped > 0 { format!("; {skipped} running (use -f)") } else { String::new() },
        if failed > 0 { format!("; {failed} failed") } else { String::new() }
    );
    Ok(if failed > 0 { EXIT_ERROR } else { 0 })
}

/// Every other command.
pub fn manage(socket: &Path, cmd: Cmd) -> Result<u8, String> {
    let mut c = connect(socket)?;
    match cmd {
        Cmd::Ps { all, quiet } => ps(&mut c, all, quiet),
        Cmd::Logs { follow, stderr: false, vm } => {
            let mut out = std::io::stdout().lock();
            c.logs(&vm, follow, &mut |d| out.write_all(d).and_then(|_| out.flush()).is_ok()).map_err(err)?;
            Ok(0)
        }
        Cmd::Logs { follow, stderr: true, vm } => {
            let mut out = std::io::stdout().lock();
            c.logs_stderr(&vm, follow, &mut |d| out.write_all(d).and_then(|_| out.flush()).is_ok()).map_err(err)?;
            Ok(0)
        }
        Cmd::Stop { grace, vms } => each(&vms, |v| c.stop(v, Some(grace.as_millis() as u64)).map(drop)),
        Cmd::Kill { vms } => each(&vms, |v| c.kill(v).map(drop)),
        Cmd::Pause { vms } => each(&vms, |v| c.pause(v).map(drop)),
        Cmd::Resume { vms } => each(&vms, |v| c.resume(v).map(drop)),
        Cmd::Wait { vm } => {
            let x = c.wait(&vm).map_err(err)?;
            if x.reason != "exited" {
                eprintln!("wisp: {vm}: {}", x.reason);
            }
            Ok(x.code as u8)
        }
        Cmd::Rm { force, all: true, .. } => rm_all(&mut c, force),
        Cmd::Rm { force, vms, family: true, .. } => each(&vms, |v| c.remove_family(v, force)),
        Cmd::Rm { force, vms, .. } => rm_many(&mut c, &vms, force),
        Cmd::Pool { set } => {
            if !set.is_empty() {
                let mut target = Vec::new();
                for s in &set {
                    let (mem, count) = wisp_vmm_process::units::parse_pool_target(s)?;
                    target.push(PoolTarget { mem, count });
                }
                c.set_pool(&PoolInfo { target, ..Default::default() }).map_err(err)?;
            }
            let p = c.pool().map_err(err)?;
            for t in &p.target {
                let ready = p.ready.iter().find(|r| r.mem == t.mem).map_or(0, |r| r.count);
                println!("{:>5} MiB: {ready} of {} ready", t.mem >> 20, t.count);
            }
            Ok(0)
        }
        Cmd::Snapshot { stop, incremental, vm, file } => {
            let path = std::path::absolute(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let s = c.snapshot_with(&vm, &wisp_api::SnapshotVm { path: path.display().to_string(), stop, incremental }).map_err(err)?;
            println!("{}: {} bytes ({} KiB of memory), the VM held {} µs", s.path, s.bytes, s.ram_bytes >> 10, s.held_us);
            Ok(0)
        }
        Cmd::Update { replace, wait, vm, new } => {
            let path = std::path::absolute(&new).map_err(|e| format!("{}: {e}", new.display()))?;
            let u = c.update_lib(&vm, &wisp_api::UpdateLib { path: path.display().to_string(), replace, wait_ms: Some(wait) }).map_err(err)?;
            println!(
                "{}: library {} is now {} ({} variables carried over, {} pointers moved{}); {:.0} µs, the VM held {} µs",
                u.vm,
                u.library,
                u.path,
                u.variables,
                u.pointers,
                if u.stale > 0 { format!(", {} pointers into the old library left stale", u.stale) } else { String::new() },
                u.took_us as f64,
                u.held_us
            );
            Ok(0)
        }
        Cmd::Migrate { to, vm } => {
            let m = c.migrate(&vm, &to).map_err(err)?;
            println!("{} -> {} at {}: {} KiB in {:.1} ms, {:.2} ms down", m.vm, m.there, m.to, m.bytes >> 10, m.took_us as f64 / 1e3, m.downtime_us as f64 / 1e3);
            Ok(0)
        }
        Cmd::Restore { name, bases, volumes, file } => {
            let abs = |f: &std::path::PathBuf| std::path::absolute(f).map(|p| p.display().to_string()).map_err(|e| format!("{}: {e}", f.display()));
            let path = abs(&file)?;
            let bases = bases.iter().map(abs).collect::<Result<Vec<_>, _>>()?;
            // The daemon opens them with this user's rights: absolute paths.
            let volumes = volumes.iter().map(|(p, ro)| Ok(wisp_api::Volume { path: abs(p)?, read_only: *ro })).collect::<Result<Vec<_>, String>>()?;
            let req = CreateVm { image: path.clone(), name, restore: Some(path), bases, volumes, ..Default::default() };
            let vm = c.create(&req).map_err(err)?;
            println!("{}", vm.id);
            Ok(0)
        }
        Cmd::Run(_) | Cmd::Inspect { .. } | Cmd::New { .. } | Cmd::Build { .. } | Cmd::Shfs { .. } | Cmd::Lib { .. } | Cmd::Recycler { .. } | Cmd::Jit { .. } | Cmd::Fn { .. } => unreachable!("handled in main"),
    }
}

