//! Templates: boot an image once, save it when its guest says it is ready
//! (`wisp::ready`, the `ready` hypercall), and start VMs from that snapshot
//! (`CreateVm::from`) — what a functions service starts its calls from.
//! The snapshot comes from the VMM process through a pipe, is checked as
//! it comes (`wisp_vmm::snapshot::receive`) and is kept in the daemon's
//! state directory (`templates/NAME.snap`, with `NAME.json` describing
//! it): a file only the daemon writes. Instances are restores of it
//! (`snapshot.rs`), its pages shared copy-on-write among them all.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wisp_api::{CreateTemplate, CreateVm, TemplateInfo};
use wisp_vmm::snapshot;

use super::create::Extras;
use super::error::ActionError;
use super::snapshot::Restorable;
use super::Daemon;

/// Longest a guest may take to say it is ready, unless the request says.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

impl Daemon {
    fn templates_dir(&self) -> PathBuf {
        self.cfg.state_dir.join("templates")
    }

    fn template_paths(&self, name: &str) -> Result<(PathBuf, PathBuf), ActionError> {
        if !super::create::valid_name(name) {
            return Err(ActionError::InvalidName(name.to_string()));
        }
        let dir = self.templates_dir();
        Ok((dir.join(format!("{name}.snap")), dir.join(format!("{name}.json"))))
    }

    /// Make template `t.name`: boot its image, save it at ready.
    pub(super) fn make_template(&self, t: CreateTemplate, arrived: Instant) -> Result<TemplateInfo, ActionError> {
        let (snap_path, info_path) = self.template_paths(&t.name)?;
        let shown = format!("template {}", t.name);
        let fail = |why: String| ActionError::Snapshot { path: shown.clone(), why };
        std::fs::create_dir_all(self.templates_dir()).map_err(|e| fail(e.to_string()))?;
        let part = self.templates_dir().join(format!("{}.snap.part", t.name));
        let file = File::options().read(true).write(true).create(true).truncate(true).open(&part).map_err(|e| fail(e.to_string()))?;
        let (mut rd, wr) = std::io::pipe().map_err(|e| fail(format!("pipe: {e}")))?;
        let mem_limit = wisp_abi::layout::MAX_MEM;
        let reader = std::thread::spawn(move || snapshot::receive(&mut rd, &file, mem_limit));
        let timeout = t.timeout_ms.map_or(READY_TIMEOUT, Duration::from_millis);
        let req = CreateVm { image: t.image.clone(), args: t.args.clone(), mem: t.mem, timeout_ms: Some(timeout.as_millis() as u64), ..Default::default() };
        // The write end goes with the start (and closes here once sent).
        let created = self.create(req, arrived, Extras { template: Some(wr.into()), ..Default::default() });
        let info = match created {
            Ok(info) => info,
            Err(e) => {
                let _ = reader.join();
                let _ = std::fs::remove_file(&part);
                return Err(e);
            }
        };
        let exit = self.wait(&info.id, Some(timeout + Duration::from_secs(5)));
        let received = reader.join().unwrap_or_else(|_| Err(snapshot::Error::Io("the reader panicked".into())));
        let made_us = arrived.elapsed().as_micros() as u64;
        let snap = match (exit, received) {
            (Ok(x), Ok(snap)) if x.code == 0 => snap,
            (exit, received) => {
                let _ = std::fs::remove_file(&part);
                let why = match (exit, received) {
                    (Ok(x), Err(snapshot::Error::Truncated { have: 0, .. })) => {
                        format!("VM {} ended ({}: {}) without saying it is ready (wisp::ready, feature READY)", info.id, x.code, x.reason)
                    }
                    (Ok(x), Ok(_)) => format!("VM {} ended {} after its snapshot: {}", info.id, x.code, x.reason),
                    (_, Err(e)) => format!("VM {}: {e}", info.id),
                    (Err(e), _) => e.to_string(),
                };
                return Err(fail(why));
            }
        };
        std::fs::rename(&part, &snap_path).map_err(|e| fail(e.to_string()))?;
        let ram_bytes = snap.runs.iter().map(|r| r.len).sum();
        let t = TemplateInfo {
            name: t.name,
            image: t.image,
            args: t.args,
            mem: snap.header.mem_size,
            bytes: snap.header.file_len,
            ram_bytes,
            vm: info.id,
            made_us,
            created_ms: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        };
        crate::fsutil::write_atomic(&info_path, &serde_json::to_vec_pretty(&t).unwrap_or_default()).map_err(|e| fail(e.to_string()))?;
        Ok(t)
    }

    /// Every template.
    pub(super) fn templates(&self) -> Result<Vec<TemplateInfo>, ActionError> {
        let mut out = Vec::new();
        let Ok(dir) = std::fs::read_dir(self.templates_dir()) else { return Ok(out) };
        for e in dir.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "json") && p.with_extension("snap").is_file() {
                // The daemon's own files; one it cannot read is left out.
                if let Some(t) = std::fs::read(&p).ok().and_then(|b| serde_json::from_slice::<TemplateInfo>(&b).ok()) {
                    out.push(t);
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Remove template `name` (VMs started from it run on: their pages are
    /// their own mapping's).
    pub(super) fn remove_template(&self, name: &str) -> Result<(), ActionError> {
        let (snap_path, info_path) = self.template_paths(name)?;
        std::fs::remove_file(&snap_path).map_err(|_| ActionError::NoTemplate(name.to_string()))?;
        let _ = std::fs::remove_file(info_path);
        Ok(())
    }

    /// Template `name`'s snapshot for a start (checked once per version,
    /// as a restore's: `snapshot.rs`).
    pub(super) fn template_snapshot(&self, name: &str) -> Result<Arc<Restorable>, ActionError> {
        let (snap_path, _) = self.template_paths(name)?;
        if !snap_path.is_file() {
            return Err(ActionError::NoTemplate(name.to_string()));
        }
        self.restorable_own(&snap_path)
    }
}
