//! `wisp shfs mkfs|add|rm|ls|info|fsck`: make and fill SHFS volumes for
//! the content cache on the host (the format: the `shfs` crate and
//! `docs/shfs.md`). An object goes in as its contents first, made durable,
//! then its table entry (one 512-byte write) commits it: a tool killed in
//! between leaves the volume as it was, with a few unreferenced chunks
//! that count as free.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use sha2::{Digest, Sha256};
use shfs::{Entry, Kind, Superblock, DIGEST_SIZE, ENTRY_SIZE, SUPERBLOCK_SIZE};

#[derive(Subcommand)]
pub enum ShfsCmd {
    /// Make an empty volume (a new file, or over an existing one).
    Mkfs {
        /// The volume file.
        volume: PathBuf,
        /// Its size, e.g. 64M (a whole number of chunks).
        #[arg(long, value_parser = crate::units::parse_mem)]
        size: u64,
        /// Bytes per chunk: 4K, 8K, 16K or 32K.
        #[arg(long, default_value = "16K", value_parser = crate::units::parse_size)]
        chunk: u64,
        /// Room for this many objects in the table.
        #[arg(long, default_value_t = 4096)]
        objects: u32,
        /// A label (at most 32 bytes).
        #[arg(long, default_value = "")]
        label: String,
    },
    /// Add a file (named by its SHA-256 digest), every file under a
    /// directory (each named by its path below it, `/dir/a.html`), or with
    /// --link an object the cache fetches from an upstream URL; prints the
    /// digests.
    Add {
        /// The volume file.
        volume: PathBuf,
        /// The file to add.
        #[arg(required_unless_present = "link", conflicts_with = "link")]
        file: Option<PathBuf>,
        /// A human name the cache also serves it by (unique).
        #[arg(long)]
        name: Option<String>,
        /// Its MIME type [default: from the file name's extension].
        #[arg(long)]
        mime: Option<String>,
        /// An upstream URL (http://...) instead of a file.
        #[arg(long)]
        link: Option<String>,
        /// The link's digest, 64 hex digits [default: SHA-256 of the URL].
        #[arg(long, requires = "link")]
        digest: Option<String>,
    },
    /// Remove an object (by digest or name).
    Rm {
        /// The volume file.
        volume: PathBuf,
        /// Its digest (64 hex digits) or name.
        object: String,
    },
    /// List the objects: digest, kind, size, MIME type, name, URL.
    Ls {
        /// The volume file.
        volume: PathBuf,
        /// Then each object's statistics as a cache last wrote them: hits,
        /// misses, bytes served, last access (Unix seconds, 0: never).
        #[arg(long)]
        stats: bool,
    },
    /// The volume's geometry and use.
    Info {
        /// The volume file.
        volume: PathBuf,
    },
    /// Check the whole volume: superblock, table, extents, and every
    /// file's contents against its digest. Exits 1 if anything is wrong.
    Fsck {
        /// The volume file.
        volume: PathBuf,
    },
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn hex(d: &[u8; DIGEST_SIZE]) -> String {
    String::from_utf8_lossy(&shfs::hex(d)).into_owned()
}

/// The MIME type of a file name, by its extension.
fn mime_of(path: &Path) -> &'static str {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    match ext.as_str() {
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "js" | "mjs" => "text/javascript",
        "json" => "application/json",
        "txt" | "md" => "text/plain",
        "xml" => "application/xml",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "ico" => "image/x-icon",
        "mp4" | "m4s" | "m4v" => "video/mp4",
        "ts" => "video/mp2t",
        "m3u8" => "application/vnd.apple.mpegurl",
        "mpd" => "application/dash+xml",
        "wasm" => "application/wasm",
        "pdf" => "application/pdf",
        _ => "application/octet-stream",
    }
}

/// An open volume: its superblock and objects (slot, entry).
struct Volume {
    file: File,
    sb: Superblock,
    objects: Vec<(u32, Entry)>,
    name: String,
}

impl Volume {
    /// Open and read `path`: a malformed superblock or any malformed entry
    /// refuses it (with `strict`), else the malformed entries are left out
    /// and reported in `problems`.
    fn open(path: &Path, write: bool, strict: bool, problems: &mut Vec<String>) -> Result<Volume, String> {
        let name = path.display().to_string();
        let file = std::fs::OpenOptions::new().read(true).write(write).open(path).map_err(|e| format!("{name}: {e}"))?;
        let len = file.metadata().map_err(|e| format!("{name}: {e}"))?.len();
        let mut b = vec![0u8; SUPERBLOCK_SIZE];
        let got = file.read_at(&mut b, 0).map_err(|e| format!("{name}: {e}"))?;
        let sb = Superblock::parse(&b[..got]).map_err(|e| format!("{name}: {e}"))?;
        if len < sb.volume_bytes() {
            return Err(format!("{name}: {}", shfs::Error::Truncated { need: sb.volume_bytes(), have: len }));
        }
        let mut table = vec![0u8; sb.slots() as usize * ENTRY_SIZE];
        file.read_exact_at(&mut table, sb.table_offset()).map_err(|e| format!("{name}: table: {e}"))?;
        let mut objects = Vec::new();
        for (slot, raw) in table.chunks_exact(ENTRY_SIZE).enumerate() {
            let raw: &[u8; ENTRY_SIZE] = raw.try_into().expect("whole entries");
            let slot = slot as u32;
            match Entry::parse(slot, raw).and_then(|e| e.map(|e| e.check(slot, &sb).map(|()| e)).transpose()) {
                Ok(Some(e)) => objects.push((slot, e)),
                Ok(None) => {}
                Err(e) if strict => return Err(format!("{name}: {e}")),
                Err(e) => problems.push(e.to_string()),
            }
        }
        Ok(Volume { file, sb, objects, name })
    }

    fn find(&self, what: &str) -> Option<&(u32, Entry)> {
        let digest = shfs::parse_hex(what);
        self.objects.iter().find(|(_, e)| Some(e.digest) == digest || (!what.is_empty() && e.name() == what))
    }

    fn write_slot(&self, slot: u32, bytes: &[u8; ENTRY_SIZE]) -> Result<(), String> {
        self.file.write_all_at(bytes, self.sb.slot_offset(slot)).map_err(|e| format!("{}: {e}", self.name))?;
        self.file.sync_data().map_err(|e| format!("{}: {e}", self.name))
    }

    /// Commit `e` into a free slot of its bucket.
    fn commit(&self, e: &Entry) -> Result<(), String> {
        let taken: Vec<u32> = self.objects.iter().map(|(s, _)| *s).collect();
        let slot = self.sb.bucket_slots(&e.digest).find(|s| !taken.contains(s)).ok_or_else(|| {
            format!("{}: the table's bucket for this digest is full (make the volume with more --objects)", self.name)
        })?;
        // A test stops the tool here (contents written, not committed) to
        // kill it: what a crash at the worst moment leaves.
        if std::env::var_os("WISP_SHFS_STOP_BEFORE_COMMIT").is_some() {
            // SAFETY: raising a signal at ourselves.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        self.write_slot(slot, &e.encode())
    }
}

pub fn run(cmd: ShfsCmd) -> Result<u8, String> {
    let mut problems = Vec::new();
    match cmd {
        ShfsCmd::Mkfs { volume, size, chunk, objects, label } => {
            let chunk = u32::try_from(chunk).map_err(|_| "--chunk: 4K, 8K, 16K or 32K".to_string())?;
            if size % chunk as u64 != 0 {
                return Err(format!("--size {size} is not a whole number of {chunk}-byte chunks"));
            }
            let sb = Superblock::new(chunk, size / chunk as u64, objects, now(), &label).map_err(|e| e.to_string())?;
            let name = volume.display().to_string();
            let f = std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&volume).map_err(|e| format!("{name}: {e}"))?;
            f.set_len(size).map_err(|e| format!("{name}: {e}"))?;
            // An empty table (an old volume's entries would come back).
            let zeros = vec![0u8; (sb.table_chunks * chunk as u64) as usize];
            f.write_all_at(&zeros, sb.table_offset()).map_err(|e| format!("{name}: {e}"))?;
            f.write_all_at(&sb.encode(), 0).map_err(|e| format!("{name}: {e}"))?;
            f.sync_all().map_err(|e| format!("{name}: {e}"))?;
            println!("{name}: SHFS, {} chunks of {chunk} bytes, room for {} objects", sb.chunks, sb.slots());
        }
        ShfsCmd::Add { volume, file: Some(dir), name: None, mime: None, link: None, digest: None } if dir.is_dir() => {
            let mut files = Vec::new();
            walk(&dir, &mut files).map_err(|e| format!("{}: {e}", dir.display()))?;
            files.sort();
            for f in &files {
                let rel = f.strip_prefix(&dir).unwrap_or(f);
                let name = format!("/{}", rel.display());
                let add = ShfsCmd::Add { volume: volume.clone(), file: Some(f.clone()), name: Some(name), mime: None, link: None, digest: None };
                if let Err(e) = run(add) {
                    return Err(format!("{e} ({} of {} files added)", files.iter().position(|x| x == f).unwrap_or(0), files.len()));
                }
            }
        }
        ShfsCmd::Add { volume, file, name, mime, link, digest } => {
            let v = Volume::open(&volume, true, true, &mut problems)?;
            let label = name.clone().unwrap_or_default();
            if !label.is_empty() && v.find(&label).is_some() {
                return Err(format!("{}: an object is named '{label}' already", v.name));
            }
            let e = match (file, link) {
                (Some(path), None) => {
                    let data = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                    let d: [u8; DIGEST_SIZE] = Sha256::digest(&data).into();
                    if let Some((_, old)) = v.objects.iter().find(|(_, e)| e.digest == d) {
                        println!("{}", hex(&old.digest));
                        eprintln!("wisp: {}: this content is there already", v.name);
                        return Ok(0);
                    }
                    let need = v.sb.chunks_for(data.len() as u64);
                    let start = v.sb.allocate(v.objects.iter().map(|(_, e)| e), need).ok_or_else(|| format!("{}: no room for {} bytes", v.name, data.len()))?;
                    v.file.write_all_at(&data, start * v.sb.chunk_size as u64).map_err(|e| format!("{}: {e}", v.name))?;
                    v.file.sync_data().map_err(|e| format!("{}: {e}", v.name))?;
                    let mime = mime.unwrap_or_else(|| mime_of(&path).to_string());
                    Entry::new(d, Kind::File, start, data.len() as u64, &mime, &label, "", now())?
                }
                (None, Some(url)) => {
                    if !url.starts_with("http://") {
                        return Err(format!("--link {url}: an http:// URL"));
                    }
                    let d = match digest {
                        Some(h) => shfs::parse_hex(&h).ok_or_else(|| format!("--digest {h}: 64 hex digits"))?,
                        None => Sha256::digest(url.as_bytes()).into(),
                    };
                    if v.objects.iter().any(|(_, e)| e.digest == d) {
                        return Err(format!("{}: an object has digest {} already", v.name, hex(&d)));
                    }
                    Entry::new(d, Kind::Link, 0, 0, mime.as_deref().unwrap_or("application/octet-stream"), &label, &url, now())?
                }
                _ => return Err("add: a FILE or --link URL".into()),
            };
            v.commit(&e)?;
            println!("{}", hex(&e.digest));
        }
        ShfsCmd::Rm { volume, object } => {
            let v = Volume::open(&volume, true, true, &mut problems)?;
            let (slot, e) = *v.find(&object).ok_or_else(|| format!("{}: no object '{object}'", v.name))?;
            v.write_slot(slot, &[0; ENTRY_SIZE])?;
            println!("removed {}", hex(&e.digest));
        }
        ShfsCmd::Ls { volume, stats } => {
            let v = Volume::open(&volume, false, true, &mut problems)?;
            for (_, e) in &v.objects {
                let kind = if e.kind == Kind::File { "file" } else { "link" };
                let line = format!("{} {kind} {:>10} {} {} {}", hex(&e.digest), e.size, e.mime(), e.name(), e.url());
                let mut line = line.trim_end().to_string();
                if stats {
                    line += &format!(" hits {} misses {} served {} last {}", e.hits, e.misses, e.bytes_served, e.last_access);
                }
                println!("{line}");
            }
        }
        ShfsCmd::Info { volume } => {
            let v = Volume::open(&volume, false, true, &mut problems)?;
            let used: u64 = v.objects.iter().map(|(_, e)| e.chunks(&v.sb)).sum();
            let data = v.sb.chunks - v.sb.data_chunk().unwrap_or(v.sb.chunks);
            println!("volume:   {} (label '{}')", v.name, v.sb.label());
            println!("format:   SHFS v{}, chunks of {} bytes, {} chunks ({} bytes)", shfs::VERSION, v.sb.chunk_size, v.sb.chunks, v.sb.volume_bytes());
            println!("table:    {} buckets of {} ({} objects at most), {} chunks", v.sb.buckets, v.sb.bucket_entries, v.sb.slots(), v.sb.table_chunks);
            println!("objects:  {} ({} files, {} links)", v.objects.len(), v.objects.iter().filter(|(_, e)| e.kind == Kind::File).count(), v.objects.iter().filter(|(_, e)| e.kind == Kind::Link).count());
            println!("data:     {used} of {data} chunks used");
        }
        ShfsCmd::Fsck { volume } => return fsck(&volume),
    }
    Ok(0)
}

/// The regular files under `dir` (links not followed).
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            walk(&e.path(), out)?;
        } else if t.is_file() {
            out.push(e.path());
        }
    }
    Ok(())
}

/// Every check, every problem reported.
fn fsck(path: &Path) -> Result<u8, String> {
    let mut problems = Vec::new();
    let v = Volume::open(path, false, false, &mut problems)?;
    let mut extents: Vec<(u64, u64, String)> = Vec::new();
    for (i, (_, e)) in v.objects.iter().enumerate() {
        let id = hex(&e.digest);
        if v.objects[..i].iter().any(|(_, o)| o.digest == e.digest) {
            problems.push(format!("{id}: two entries have this digest"));
        }
        if !e.name().is_empty() && v.objects[..i].iter().any(|(_, o)| o.name() == e.name()) {
            problems.push(format!("{id}: the name '{}' is given twice", e.name()));
        }
        if !e.stored() {
            continue;
        }
        extents.push((e.start, e.start + e.chunks(&v.sb), id.clone()));
        // A fetched link's digest names it, not its bytes.
        if e.kind != Kind::File {
            continue;
        }
        let mut data = vec![0u8; e.size as usize];
        match v.file.read_exact_at(&mut data, e.start * v.sb.chunk_size as u64) {
            Ok(()) if <[u8; DIGEST_SIZE]>::from(Sha256::digest(&data)) == e.digest => {}
            Ok(()) => problems.push(format!("{id}: its contents do not match its digest")),
            Err(err) => problems.push(format!("{id}: cannot read its contents: {err}")),
        }
    }
    extents.sort();
    for w in extents.windows(2) {
        if w[1].0 < w[0].1 {
            problems.push(format!("{} and {} share chunks", w[0].2, w[1].2));
        }
    }
    for p in &problems {
        println!("fsck: {p}");
    }
    if problems.is_empty() {
        println!("fsck: {}: {} objects, clean", v.name, v.objects.len());
        Ok(0)
    } else {
        println!("fsck: {}: {} problems", v.name, problems.len());
        Ok(1)
    }
}
