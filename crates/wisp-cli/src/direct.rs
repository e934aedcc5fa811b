//! `wisp run` and `wisp inspect` without a daemon: boot one VM in this
//! process, or describe an image file.

use std::io::Write;
use std::path::{Path, PathBuf};

use wisp_vmm::{open_kvm, Image, NetConfig, Outcome, Shell, Vm, DEFAULT_MEM};

use crate::{monotonic_ns, RunArgs, EXIT_STOPPED, EXIT_TIMEOUT};

/// Directories searched for bundled images, in order.
pub fn image_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("WISP_IMAGE_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Some(exe_dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        dirs.push(exe_dir.join("images"));
        // Development tree: target/<profile>/wisp -> build/images.
        dirs.push(exe_dir.join("../../build/images"));
    }
    dirs
}

/// Resolve IMAGE: an existing path, or the name of a bundled app.
pub fn resolve_image(image: &str) -> Result<PathBuf, String> {
    let p = Path::new(image);
    if image.contains('/') || p.exists() {
        return Ok(p.to_path_buf());
    }
    let dirs = image_dirs();
    if let Some(found) = dirs.iter().map(|d| d.join(image)).find(|c| c.is_file()) {
        return Ok(found);
    }
    let mut bundled: Vec<String> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    bundled.sort();
    bundled.dedup();
    Err(format!(
        "no such image: '{image}' is neither a file nor a bundled app (bundled: {})",
        if bundled.is_empty() { "none found; run `make` first".to_string() } else { bundled.join(", ") }
    ))
}

pub fn load_image(image: &str) -> Result<Image, String> {
    let path = resolve_image(image)?;
    Image::from_file(&path).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn run(a: &RunArgs, t_main: u64) -> Result<(u8, Option<Vm>), String> {
    let (image, mem, timeout, stats, args) = (&a.image, a.mem, a.timeout, a.stats, &a.args);
    let img = load_image(image)?;
    let net = match (&a.tap, a.ip) {
        (Some(tap), Some(ip)) => Some(NetConfig {
            tap: wisp_vmm::tap::open_tap(tap).map_err(|e| format!("tap {tap}: {e}"))?,
            mac: a.mac.unwrap_or([0x52, 0x54, 0x00, ip.0[1], ip.0[2], ip.0[3]]),
            ip,
            gateway: a.gw,
        }),
        _ => None,
    };
    let kvm = open_kvm().map_err(|e| e.to_string())?;
    let shell = Shell::create(&kvm, mem.unwrap_or(DEFAULT_MEM)).map_err(|e| e.to_string())?;
    let mut vm = shell.load_with(&img, args, net).map_err(|e| e.to_string())?;
    // Without a daemon a family lives in this process tree: forked VMs are
    // child processes of this one and end when their parent does.
    vm.set_family_options(wisp_vmm::FamilyOptions { fork: true, limit: a.family_limit, orphans_die: true });
    let mut stdout = std::io::stdout().lock();
    let outcome = vm.run(&mut stdout, timeout);
    let _ = stdout.flush();
    drop(stdout);
    let t_done = monotonic_ns();
    let code = match &outcome {
        Outcome::Exited(c) => *c as u8,
        Outcome::Stopped(wisp_vmm::StopReason::Timeout) => EXIT_TIMEOUT,
        Outcome::Stopped(_) => EXIT_STOPPED,
    };
    if let Outcome::Stopped(reason) = &outcome {
        eprintln!("wisp: VM stopped: {reason}");
    }
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
            "wisp-stats: {{\"t_main_ns\":{t_main},\"t_done_ns\":{t_done},\"exits\":{},\"hypercalls\":{},\"phases_us\":{}}}",
            s.exits,
            s.hypercalls,
            s.phases_json()
        );
    }
    Ok((code, Some(vm)))
}

pub fn inspect(image: &str) -> Result<u8, String> {
    let img = load_image(image)?;
    let min_mem = wisp_vmm::check_mem_size(img.end() + wisp_abi::layout::MIN_HEAP)
        .unwrap_or(wisp_abi::layout::MIN_MEM)
        .max(wisp_abi::layout::MIN_MEM);
    println!("image:     {} ({} bytes)", img.name, img.bytes.len());
    println!("abi:       wisp v{} (this monitor: v{})", img.abi_version, wisp_abi::ABI_VERSION);
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
