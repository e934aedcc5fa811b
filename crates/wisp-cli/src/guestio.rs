//! What a guest is given beside its arguments (`wisp run -e, --env-file,
//! --file, -i`): its environment and read-only files, read here with this
//! user's rights (through wispd they travel in the request, so the daemon
//! never opens a file for a client). Its standard streams in this
//! process: `wisp_vmm_process::terminal`.

use std::path::PathBuf;
use std::sync::Arc;

use crate::RunArgs;

/// The environment: `--env-file` lines first, then `-e` (a later entry of a
/// key wins, as the guest's `env::var` reads the last).
pub fn env(a: &RunArgs) -> Result<Vec<String>, String> {
    let mut env = Vec::new();
    for f in &a.env_file {
        let text = std::fs::read_to_string(f).map_err(|e| format!("--env-file {}: {e}", f.display()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            env.push(entry(line).map_err(|e| format!("--env-file {} line {}: {e}", f.display(), n + 1))?);
        }
    }
    for e in &a.env {
        env.push(entry(e).map_err(|m| format!("-e {e}: {m}"))?);
    }
    Ok(env)
}

/// `KEY=VALUE`, or `KEY` for this process's value of it.
fn entry(e: &str) -> Result<String, String> {
    match e.split_once('=') {
        Some(("", _)) => Err("an empty key".into()),
        Some(_) if e.contains('\0') => Err("a NUL byte".into()),
        Some(_) => Ok(e.to_string()),
        None => match std::env::var(e) {
            Ok(v) => Ok(format!("{e}={v}")),
            Err(_) => Err(format!("'{e}' is neither KEY=VALUE nor a variable set here")),
        },
    }
}

/// Parse `--file HOST:GUEST` (GUEST absolute).
pub fn parse_file_map(s: &str) -> Result<(PathBuf, String), String> {
    let (host, guest) = s.rsplit_once(':').ok_or_else(|| format!("'{s}': expected HOST:GUEST, e.g. app.conf:/etc/app.conf"))?;
    if host.is_empty() || !guest.starts_with('/') {
        return Err(format!("'{s}': expected HOST:GUEST with GUEST an absolute path, e.g. app.conf:/etc/app.conf"));
    }
    Ok((PathBuf::from(host), guest.to_string()))
}

/// Parse `--volume FILE[:ro]`: the path, and whether read-only.
pub fn parse_volume(s: &str) -> Result<(PathBuf, bool), String> {
    match s.strip_suffix(":ro") {
        Some("") => Err(format!("'{s}': expected FILE[:ro]")),
        Some(path) => Ok((PathBuf::from(path), true)),
        None if s.is_empty() => Err("expected FILE[:ro]".into()),
        None => Ok((PathBuf::from(s.strip_suffix(":rw").unwrap_or(s)), false)),
    }
}

/// The files, read now: regular files of at most `limit` bytes together
/// (checked before any is read; `over` says why not).
pub fn files(a: &RunArgs, limit: u64, over: &dyn Fn(u64) -> String) -> Result<Vec<(String, Arc<[u8]>)>, String> {
    let mut total = 0u64;
    for (host, _) in &a.files {
        let m = std::fs::metadata(host).map_err(|e| format!("--file {}: {e}", host.display()))?;
        if !m.is_file() {
            return Err(format!("--file {}: not a regular file", host.display()));
        }
        total += m.len();
    }
    if total > limit {
        return Err(format!("--file: {}", over(total)));
    }
    a.files
        .iter()
        .map(|(host, guest)| {
            let data = std::fs::read(host).map_err(|e| format!("--file {}: {e}", host.display()))?;
            Ok((guest.clone(), Arc::from(data)))
        })
        .collect()
}

