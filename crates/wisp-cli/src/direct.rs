//! `wisp run` and `wisp inspect` without a daemon: boot one VM in this
//! process (through the VMM process's boot path, `wisp_vmm_process`), or
//! describe an image file. The console is this process's stdout.

use std::io::Write;

use wisp_vmm::{DataDevice, Outcome, Vm, DEFAULT_MEM};
use wisp_vmm_process::boot::{self, Boot};
use wisp_vmm_process::exit::{exit_info, Runner};
use wisp_vmm_process::images::load_image;
use wisp_vmm_process::nic::tap_nic;

use crate::guestio;
use wisp_vmm_process::terminal::Terminal;
use crate::{monotonic_ns, RunArgs};

pub fn run(a: &RunArgs, t_main: u64) -> Result<(u8, Option<Vm>), String> {
    let (image, mem, timeout, stats, args) = (&a.image, a.mem, a.timeout, a.stats, &a.args);
    let img = load_image(image)?;
    let net = match (&a.tap, a.ip) {
        (Some(tap), Some(ip)) => Some(tap_nic(tap, ip, a.mac, a.gw, a.net_rate.unwrap_or_default())?),
        _ => None,
    };
    // Files live in guest RAM: at most what it could hold.
    let over = |n| format!("{n} bytes of files, more than the largest guest RAM");
    let (env, files) = (guestio::env(a)?, guestio::files(a, wisp_abi::layout::MAX_MEM, &over)?);
    let data = if env.is_empty() && files.is_empty() { None } else { Some(DataDevice::new(&env, &files).map_err(|e| e.to_string())?) };
    let disks = a.volumes.iter().map(|(p, ro)| wisp_vmm::BlockConfig::open(p, *ro)).collect::<Result<Vec<_>, _>>()?;
    let libraries = a.libs.iter().map(|p| crate::libs::device(p)).collect::<Result<Vec<_>, _>>()?;
    let shell = boot::prepare(mem.unwrap_or(DEFAULT_MEM)).map_err(|e| e.to_string())?;
    let family = boot::direct_family(a.family_limit.unwrap_or(wisp_api::MAX_FAMILY));
    let mut vm = boot::load(shell, Boot { image: &img, args, net: net.into_iter().collect(), data, disks, libraries, family }).map_err(|e| e.to_string())?;
    if a.interactive {
        wisp_vmm_process::terminal::feed_stdin(vm.attach_stdin());
    }
    // A stopped VM says why before its parent hears of it (a forked child
    // ends with its parent: after that it could say nothing).
    vm.on_end(|o| {
        if let Outcome::Stopped(_) = o {
            wisp_vmm::stderr_line(&format!("wisp: VM stopped: {}", exit_info(o, Runner::Direct).reason));
        }
    });
    let mut term = Terminal(std::io::stdout().lock());
    let outcome = vm.run(&mut term, timeout);
    let _ = term.flush();
    drop(term);
    let t_done = monotonic_ns();
    let exit = exit_info(&outcome, Runner::Direct);
    if stats {
        let s = vm.stats();
        let total_us = (t_done - t_main) as f64 / 1e3;
        let phases: Vec<String> = s.phases.iter().map(|(n, v)| format!("{n} {:.0}", v)).collect();
        eprintln!(
            "wisp: {} {} in {:.2} ms from main() ({} µs; {} exits, {} hypercalls)",
            img.name,
            match &outcome {
                Outcome::Exited(c) => format!("exited {c}"),
                Outcome::Stopped(_) => "was stopped".into(),
            },
            total_us / 1e3,
            phases.join(", "),
            s.exits,
            s.hypercalls
        );
        eprintln!(
            "wisp-stats: {{\"t_main_ns\":{t_main},\"t_done_ns\":{t_done},\"exits\":{},\"hypercalls\":{},\"forks_prepared\":{},\"forks_recycled\":{},\"phases_us\":{}}}",
            s.exits,
            s.hypercalls,
            s.forks_prepared,
            s.forks_recycled,
            s.phases_json()
        );
    }
    Ok((exit.code as u8, Some(vm)))
}

pub fn inspect(image: &str) -> Result<u8, String> {
    let img = load_image(image)?;
    let min_mem = wisp_vmm::check_mem_size(img.end() + wisp_abi::layout::MIN_HEAP)
        .unwrap_or(wisp_abi::layout::MIN_MEM)
        .max(wisp_abi::layout::MIN_MEM);
    println!("image:     {} ({} bytes)", img.name, img.bytes.len());
    println!("abi:       wisp v{} (this monitor: v{})", img.abi_version, wisp_abi::ABI_VERSION);
    println!("features:  {}", wisp_abi::features::Names(img.manifest.feature_bits()));
    let devices: Vec<String> = img
        .manifest
        .devices()
        .iter()
        .map(|d| {
            let kind = wisp_abi::DeviceKind::from_u32(d.kind).map_or(format!("kind {}", d.kind), |k| k.name().to_string());
            format!("{} ({kind}, {})", d.name(), if d.required() { "required" } else { "optional" })
        })
        .collect();
    println!("devices:   {}", if devices.is_empty() { "none".to_string() } else { devices.join(", ") });
    if let Some(p) = &img.lib_policy {
        use wisp_abi::libpolicy::loader;
        let keys: Vec<String> = p.keys().iter().map(|k| k.iter().take(8).map(|b| format!("{b:02x}")).collect::<String>() + "…").collect();
        let from: Vec<&str> = [(loader::NAMED, "named"), (loader::CREATOR, "creator"), (loader::UPDATE, "update")].iter().filter(|(b, _)| p.loaders & b != 0).map(|(_, n)| *n).collect();
        let [major, minor, patch, _] = p.min_version;
        println!(
            "libraries: signed by {}; version {major}.{minor}.{patch} or newer; from: {}",
            if keys.is_empty() { "anyone (or unsigned)".to_string() } else { keys.join(", ") },
            if from.is_empty() { "nobody".to_string() } else { from.join(", ") }
        );
    }
    if let Some(n) = img.relocated {
        println!("placed:    position-independent, at {:#x} ({n} relocations)", wisp_abi::layout::IMAGE_BASE);
    }
    println!("entry:     {:#x}", img.entry);
    println!("loaded:    {:#x}..{:#x} ({} KiB)", img.start(), img.end(), (img.end() - img.start()) >> 10);
    println!("min --mem: {} MiB", min_mem >> 20);
    println!("segments:");
    println!("  {:<12} {:<10} {:<10} {:<10} perms", "vaddr", "memsz", "filesz", "offset");
    for s in &img.segments {
        println!("  {:<#12x} {:<#10x} {:<#10x} {:<#10x} {}", s.vaddr, s.memsz, s.filesz, s.offset, s.perms());
    }
    Ok(0)
}
