//! Images: static ELF64 x86-64 executables that carry the wisp ABI note, or
//! static position-independent ones, placed at the image base when read
//! (`pie.rs`).
//!
//! An image file is untrusted input. [`Image::parse`] checks every field it
//! uses against the file's length and the guest memory map before anything
//! is loaded; a malformed file gives an [`Error::BadImage`] naming the problem.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use wisp_abi::layout::{align_up, IMAGE_BASE, MAX_MEM, PAGE_SIZE};
use wisp_abi::libpolicy::LibPolicy;
use wisp_abi::{ImageNote, ABI_VERSION, NOTE_NAME, NOTE_TYPE_ABI, NOTE_TYPE_LIBS};

use crate::error::{Error, Result};

mod pie;

/// Largest image file accepted.
pub const MAX_IMAGE_FILE: u64 = 256 << 20;
const MAX_PHDRS: usize = 64;
const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
const PT_LOAD: u32 = 1;
const PT_INTERP: u32 = 3;
const PT_NOTE: u32 = 4;
/// Segment flag: executable.
pub const PF_X: u32 = 1;
/// Segment flag: writable.
pub const PF_W: u32 = 2;
/// Segment flag: readable.
pub const PF_R: u32 = 4;

/// One loadable segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Guest address of the segment's first byte.
    pub vaddr: u64,
    /// Bytes in memory (the part beyond `filesz` is zero).
    pub memsz: u64,
    /// Bytes taken from the file.
    pub filesz: u64,
    /// Offset of those bytes in the file.
    pub offset: u64,
    /// `PF_R | PF_W | PF_X` bits.
    pub flags: u32,
}

impl Segment {
    /// One past the segment's last byte.
    pub fn end(&self) -> u64 {
        self.vaddr + self.memsz
    }

    /// "rwx"-style permission string.
    pub fn perms(&self) -> String {
        let f = |bit, c| if self.flags & bit != 0 { c } else { '-' };
        [f(PF_R, 'r'), f(PF_W, 'w'), f(PF_X, 'x')].iter().collect()
    }
}

/// A parsed, validated image. Cheap to clone: the file bytes are shared.
#[derive(Clone, Debug)]
pub struct Image {
    /// Name shown to the guest as argument 0 (the file name).
    pub name: String,
    /// The file's bytes.
    pub bytes: Arc<[u8]>,
    /// Entry point.
    pub entry: u64,
    /// Loadable segments, sorted by address, not overlapping.
    pub segments: Vec<Segment>,
    /// ABI version from the image note.
    pub abi_version: u32,
    /// The image's manifest (features and devices it needs), from its note.
    pub manifest: ImageNote,
    /// Its policy for the shared libraries it may be given (its second
    /// note; none: any library from any loader).
    pub lib_policy: Option<LibPolicy>,
    /// A descriptor of the file (e.g. the image cache's sealed memfd): if
    /// set, whole pages of segments are mapped copy-on-write from it
    /// instead of copied.
    pub file: Option<Arc<OwnedFd>>,
    /// For a position-independent file: the relocations applied to place
    /// it at the image base (`bytes` holds the result, a static executable).
    pub relocated: Option<usize>,
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap_or([0; 4]))
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap_or([0; 8]))
}

fn bad<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::BadImage(msg.into()))
}

impl Image {
    /// Read and parse an image file.
    pub fn from_file(path: &Path) -> Result<Image> {
        let err = |err| Error::ImageRead { path: path.display().to_string(), err };
        let meta = std::fs::metadata(path).map_err(err)?;
        if !meta.is_file() {
            return bad(format!("{} is not a regular file", path.display()));
        }
        if meta.len() > MAX_IMAGE_FILE {
            return bad(format!(
                "{} is {} bytes, larger than the {} MiB limit",
                path.display(),
                meta.len(),
                MAX_IMAGE_FILE >> 20
            ));
        }
        let bytes = std::fs::read(path).map_err(err)?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Image::parse(&name, bytes.into())
    }

    /// Parse and validate an image held in memory.
    pub fn parse(name: &str, bytes: Arc<[u8]>) -> Result<Image> {
        let b = &bytes[..];
        if b.len() < 4 || &b[..4] != b"\x7fELF" {
            return bad("not an ELF file (bad magic)");
        }
        if b.len() < EHDR_SIZE {
            return bad(format!("truncated ELF header ({} bytes)", b.len()));
        }
        match b[4] {
            2 => {}
            1 => return bad("32-bit ELF (ELFCLASS32): wisp images are ELF64"),
            c => return bad(format!("unknown ELF class {c}")),
        }
        if b[5] != 1 {
            return bad("big-endian ELF: wisp images are little endian");
        }
        let e_type = u16_at(b, 16);
        let machine = u16_at(b, 18);
        if machine != 62 {
            return bad(format!("ELF machine {machine} is not x86-64 (62)"));
        }
        if e_type != 2 && e_type != 3 {
            return bad(format!("ELF type {e_type} is not an executable (ET_EXEC, or ET_DYN for a static PIE)"));
        }
        let entry = u64_at(b, 24);
        let phoff = u64_at(b, 32);
        let phentsize = u16_at(b, 54) as usize;
        let phnum = u16_at(b, 56) as usize;
        if phentsize != PHDR_SIZE {
            return bad(format!("program header size {phentsize}, expected {PHDR_SIZE}"));
        }
        if phnum == 0 || phnum > MAX_PHDRS {
            return bad(format!("{phnum} program headers (1..={MAX_PHDRS} allowed)"));
        }
        let ph_end = phoff.checked_add((phnum * PHDR_SIZE) as u64);
        if ph_end.is_none_or(|e| e > b.len() as u64) {
            return bad("program headers extend past the end of the file (truncated?)");
        }
        if e_type == 3 {
            let (exec, n) = pie::relocate(b)?;
            let mut img = Image::parse(name, exec.into())?;
            img.relocated = Some(n);
            return Ok(img);
        }
        let mut segments = Vec::new();
        let (mut note, mut policy) = (None, None);
        for i in 0..phnum {
            let p = phoff as usize + i * PHDR_SIZE;
            let p_type = u32_at(b, p);
            let flags = u32_at(b, p + 4);
            let offset = u64_at(b, p + 8);
            let vaddr = u64_at(b, p + 16);
            let filesz = u64_at(b, p + 32);
            let memsz = u64_at(b, p + 40);
            let in_file = offset.checked_add(filesz).is_some_and(|e| e <= b.len() as u64);
            match p_type {
                PT_INTERP => return bad("dynamically linked (PT_INTERP): wisp images are static"),
                PT_LOAD => {
                    if memsz == 0 {
                        continue;
                    }
                    if !in_file {
                        return bad(format!("segment {i}: file range extends past the end of the file (truncated?)"));
                    }
                    if filesz > memsz {
                        return bad(format!("segment {i}: file size {filesz:#x} exceeds memory size {memsz:#x}"));
                    }
                    if vaddr < IMAGE_BASE {
                        return bad(format!(
                            "segment {i} at {vaddr:#x} is below the image base {IMAGE_BASE:#x} \
                             (a Linux executable? wisp images are linked at {IMAGE_BASE:#x})"
                        ));
                    }
                    if vaddr.checked_add(memsz).is_none_or(|e| e > MAX_MEM) {
                        return bad(format!(
                            "segment {i} at {vaddr:#x} of {memsz:#x} bytes ends beyond the largest guest RAM ({} MiB)",
                            MAX_MEM >> 20
                        ));
                    }
                    segments.push(Segment { vaddr, memsz, filesz, offset, flags });
                }
                PT_NOTE if in_file => {
                    let area = &b[offset as usize..(offset + filesz) as usize];
                    if let Some(desc) = find_note(area, NOTE_TYPE_ABI) {
                        note = Some(ImageNote::parse(desc).ok_or_else(|| Error::BadImage("malformed wisp ABI note (manifest)".into()))?);
                    }
                    if let Some(desc) = find_note(area, NOTE_TYPE_LIBS) {
                        policy = Some(LibPolicy::parse(desc).ok_or_else(|| Error::BadImage("malformed wisp library-policy note".into()))?);
                    }
                }
                _ => {}
            }
        }
        if segments.is_empty() {
            return bad("no loadable segments");
        }
        segments.sort_by_key(|s| s.vaddr);
        for w in segments.windows(2) {
            if w[0].end() > w[1].vaddr {
                return bad(format!("segments at {:#x} and {:#x} overlap", w[0].vaddr, w[1].vaddr));
            }
        }
        if !segments.iter().any(|s| s.flags & PF_X != 0 && entry >= s.vaddr && entry < s.end()) {
            return bad(format!("entry point {entry:#x} is not inside an executable segment"));
        }
        let Some(note) = note else {
            return bad("no wisp ABI note: not a wisp image (was it linked with wisp-libos?)");
        };
        if note.abi_version != ABI_VERSION {
            return Err(Error::AbiMismatch { image: note.abi_version, monitor: ABI_VERSION });
        }
        Ok(Image { name: name.to_string(), bytes, entry, segments, abi_version: note.abi_version, manifest: note, lib_policy: policy, file: None, relocated: None })
    }

    /// Parse an image held in a file descriptor (read by position, so a
    /// descriptor shared with other processes is not disturbed) and keep the
    /// descriptor for copy-on-write mapping.
    pub fn from_fd(name: &str, fd: OwnedFd) -> Result<Image> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::from(fd);
        let err = |err| Error::ImageRead { path: name.to_string(), err };
        let len = f.metadata().map_err(err)?.len();
        if len > MAX_IMAGE_FILE {
            return bad(format!("{name} is {len} bytes, larger than the {} MiB limit", MAX_IMAGE_FILE >> 20));
        }
        let mut bytes = vec![0u8; len as usize];
        f.read_exact_at(&mut bytes, 0).map_err(err)?;
        let mut img = Image::parse(name, bytes.into())?;
        // Pages may be mapped from the file only if they are what it holds:
        // a relocated PIE's are not (its pointers would be the unrelocated
        // ones: the guest jumps to 0).
        if img.relocated.is_none() {
            img.file = Some(Arc::new(OwnedFd::from(f)));
        }
        Ok(img)
    }

    /// Whether the image declares the fork feature (it may fork).
    pub fn forks(&self) -> bool {
        self.manifest.feature_bits() & wisp_abi::features::FORK != 0
    }

    /// Lowest address used by the image.
    pub fn start(&self) -> u64 {
        self.segments[0].vaddr & !(PAGE_SIZE - 1)
    }

    /// One past the image's last byte, rounded up to a page.
    pub fn end(&self) -> u64 {
        align_up(self.segments.iter().map(Segment::end).max().unwrap_or(IMAGE_BASE), PAGE_SIZE)
    }

    /// Bytes of the file loaded into memory.
    pub fn file_bytes(&self, s: &Segment) -> &[u8] {
        &self.bytes[s.offset as usize..(s.offset + s.filesz) as usize]
    }
}

/// Walk an ELF note area looking for the wisp note of type `ntype`: its
/// descriptor.
fn find_note(mut area: &[u8], want: u32) -> Option<&[u8]> {
    while area.len() >= 12 {
        let namesz = u32_at(area, 0) as usize;
        let descsz = u32_at(area, 4) as usize;
        let ntype = u32_at(area, 8);
        let name_end = 12usize.checked_add(align4(namesz)?)?;
        let desc_end = name_end.checked_add(align4(descsz)?)?;
        if desc_end > area.len() || 12 + namesz > area.len() || name_end + descsz > area.len() {
            return None;
        }
        if ntype == want && &area[12..12 + namesz] == NOTE_NAME {
            return Some(&area[name_end..name_end + descsz]);
        }
        area = &area[desc_end..];
    }
    None
}

fn align4(x: usize) -> Option<usize> {
    x.checked_add(3).map(|v| v & !3)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal valid image: one RX segment at 1 MiB and the ABI note
    /// (a manifest that needs nothing).
    pub(crate) fn tiny_image(abi: u32) -> Vec<u8> {
        let mut f = vec![0u8; 0x1000];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = 1;
        f[6] = 1;
        f[16..18].copy_from_slice(&2u16.to_le_bytes());
        f[18..20].copy_from_slice(&62u16.to_le_bytes());
        f[24..32].copy_from_slice(&0x10_0000u64.to_le_bytes());
        f[32..40].copy_from_slice(&64u64.to_le_bytes());
        f[54..56].copy_from_slice(&56u16.to_le_bytes());
        f[56..58].copy_from_slice(&2u16.to_le_bytes());
        let ph = |f: &mut Vec<u8>, at: usize, t: u32, fl: u32, off: u64, va: u64, sz: u64| {
            f[at..at + 4].copy_from_slice(&t.to_le_bytes());
            f[at + 4..at + 8].copy_from_slice(&fl.to_le_bytes());
            f[at + 8..at + 16].copy_from_slice(&off.to_le_bytes());
            f[at + 16..at + 24].copy_from_slice(&va.to_le_bytes());
            f[at + 32..at + 40].copy_from_slice(&sz.to_le_bytes());
            f[at + 40..at + 48].copy_from_slice(&sz.to_le_bytes());
        };
        ph(&mut f, 64, PT_LOAD, PF_R | PF_X, 0x800, 0x10_0000, 0x10);
        ph(&mut f, 120, PT_NOTE, PF_R, 0x200, 0, 20 + wisp_abi::IMAGE_NOTE_SIZE as u64);
        f[0x200..0x204].copy_from_slice(&5u32.to_le_bytes());
        f[0x204..0x208].copy_from_slice(&(wisp_abi::IMAGE_NOTE_SIZE as u32).to_le_bytes());
        f[0x208..0x20c].copy_from_slice(&NOTE_TYPE_ABI.to_le_bytes());
        f[0x20c..0x211].copy_from_slice(NOTE_NAME);
        f[0x214..0x218].copy_from_slice(&abi.to_le_bytes());
        f
    }

    /// A minimal static PIE linked at 0: one RX segment over the whole
    /// file, the note, and a dynamic section with one relative relocation
    /// (the word at 0x900 becomes the address of 0x850).
    fn tiny_pie() -> Vec<u8> {
        let mut f = tiny_image(ABI_VERSION);
        f[16..18].copy_from_slice(&3u16.to_le_bytes());
        f[24..32].copy_from_slice(&0x800u64.to_le_bytes());
        f[56..58].copy_from_slice(&3u16.to_le_bytes());
        let put = |f: &mut Vec<u8>, at: usize, v: u64| f[at..at + 8].copy_from_slice(&v.to_le_bytes());
        // The load segment: offset 0, vaddr 0, 0x1000 bytes.
        put(&mut f, 64 + 8, 0);
        put(&mut f, 64 + 16, 0);
        put(&mut f, 64 + 32, 0x1000);
        put(&mut f, 64 + 40, 0x1000);
        // PT_DYNAMIC at 0x300.
        f[176..180].copy_from_slice(&2u32.to_le_bytes());
        put(&mut f, 176 + 8, 0x300);
        put(&mut f, 176 + 16, 0x300);
        put(&mut f, 176 + 32, 0x40);
        put(&mut f, 176 + 40, 0x40);
        for (i, (tag, val)) in [(7u64, 0x400u64), (8, 24), (9, 24), (0, 0)].into_iter().enumerate() {
            put(&mut f, 0x300 + 16 * i, tag);
            put(&mut f, 0x308 + 16 * i, val);
        }
        put(&mut f, 0x400, 0x900);
        put(&mut f, 0x408, 8);
        put(&mut f, 0x410, 0x850);
        f
    }

    #[test]
    fn a_static_pie_is_placed_at_the_image_base() {
        let img = parse(tiny_pie()).unwrap();
        assert_eq!(img.relocated, Some(1));
        assert_eq!(img.entry, IMAGE_BASE + 0x800);
        assert_eq!((img.segments[0].vaddr, img.segments[0].offset), (IMAGE_BASE, 0));
        assert_eq!(u64_at(&img.bytes, 0x900), IMAGE_BASE + 0x850);
        // What it became is an ordinary image, read again the same way
        // (as a VMM process reads the daemon's cached copy).
        let again = parse(img.bytes.to_vec()).unwrap();
        assert_eq!((again.relocated, again.entry, u64_at(&again.bytes, 0x900)), (None, img.entry, IMAGE_BASE + 0x850));
    }

    #[test]
    fn a_pie_read_from_a_descriptor_is_not_mapped_from_it() {
        let path = std::env::temp_dir().join(format!("wisp-pie-{}", std::process::id()));
        std::fs::write(&path, tiny_pie()).unwrap();
        let img = Image::from_fd("pie", std::fs::File::open(&path).unwrap().into()).unwrap();
        assert_eq!(img.relocated, Some(1));
        assert!(img.file.is_none(), "the relocated bytes differ from the file's");
        std::fs::write(&path, &img.bytes[..]).unwrap();
        let exec = Image::from_fd("exec", std::fs::File::open(&path).unwrap().into()).unwrap();
        assert!(exec.file.is_some(), "an image as the file holds it is mapped from it");
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_pie_that_is_not_static_is_refused() {
        let refused = |f: Vec<u8>, what: &str| match parse(f) {
            Err(Error::BadImage(m)) => assert!(m.contains(what), "{m}"),
            other => panic!("accepted: {other:?}"),
        };
        let mut b = tiny_pie();
        b[0x408] = 1; // R_X86_64_64: a symbol's address
        refused(b, "type 1");
        let mut b = tiny_pie();
        b[0x300] = 1; // DT_NEEDED
        refused(b, "DT_NEEDED");
        let mut b = tiny_pie();
        b[0x400..0x408].copy_from_slice(&0x18u64.to_le_bytes()); // the entry point's field
        refused(b, "into the ELF headers");
        let mut b = tiny_pie();
        b[0x318..0x320].copy_from_slice(&25u64.to_le_bytes()); // DT_RELASZ not whole entries
        refused(b, "expected entries of 24");
        let mut b = tiny_pie();
        b[0x400..0x408].copy_from_slice(&0x2000u64.to_le_bytes()); // outside the segment
        refused(b, "outside");
        let mut b = tiny_pie();
        b[0x308..0x310].copy_from_slice(&0x5000u64.to_le_bytes()); // the table outside
        refused(b, "relocation table");
        let full = tiny_pie();
        for len in 0..full.len() {
            assert!(parse(full[..len].to_vec()).is_err(), "truncated to {len} accepted");
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut b = full.clone();
            for _ in 0..6 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = [0x300, 0x400, 176, 64, 16][(x % 5) as usize] + ((x >> 8) % 24) as usize;
                b[i] = (x >> 32) as u8;
            }
            let _ = parse(b);
        }
    }

    fn parse(b: Vec<u8>) -> Result<Image> {
        Image::parse("t", b.into())
    }

    #[test]
    fn accepts_minimal_image() {
        let img = parse(tiny_image(ABI_VERSION)).unwrap();
        assert_eq!(img.entry, 0x10_0000);
        assert_eq!(img.segments.len(), 1);
        assert_eq!(img.end(), 0x10_1000);
        assert_eq!(img.segments[0].perms(), "r-x");
    }

    #[test]
    fn rejects_abi_mismatch() {
        assert!(matches!(parse(tiny_image(99)), Err(Error::AbiMismatch { image: 99, .. })));
    }

    #[test]
    fn rejects_every_truncation() {
        let full = tiny_image(ABI_VERSION);
        for len in 0..0x220 {
            assert!(parse(full[..len].to_vec()).is_err(), "truncated to {len} accepted");
        }
    }

    #[test]
    fn rejects_bad_headers() {
        let mut b = tiny_image(ABI_VERSION);
        b[4] = 1;
        assert!(matches!(parse(b), Err(Error::BadImage(m)) if m.contains("32-bit")));
        let mut b = tiny_image(ABI_VERSION);
        b[18] = 3;
        assert!(matches!(parse(b), Err(Error::BadImage(m)) if m.contains("machine")));
        let mut b = tiny_image(ABI_VERSION);
        b[16] = 4;
        assert!(matches!(parse(b), Err(Error::BadImage(m)) if m.contains("ET_EXEC")));
        // Huge segment.
        let mut b = tiny_image(ABI_VERSION);
        b[64 + 40..64 + 48].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(parse(b), Err(Error::BadImage(m)) if m.contains("largest guest RAM")));
        // Entry outside code.
        let mut b = tiny_image(ABI_VERSION);
        b[24..32].copy_from_slice(&0x20_0000u64.to_le_bytes());
        assert!(matches!(parse(b), Err(Error::BadImage(m)) if m.contains("entry")));
        // Note missing.
        let mut b = tiny_image(ABI_VERSION);
        b[0x208] ^= 1;
        assert!(matches!(parse(b), Err(Error::BadImage(m)) if m.contains("ABI note")));
        // A manifest with more devices than the table holds.
        let mut b = tiny_image(ABI_VERSION);
        b[0x218] = 99;
        assert!(matches!(parse(b), Err(Error::BadImage(m)) if m.contains("malformed")));
        // Hostile note sizes.
        let mut b = tiny_image(ABI_VERSION);
        b[0x200..0x204].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse(b).is_err());
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let base = tiny_image(ABI_VERSION);
        for _ in 0..2000 {
            let mut b = base.clone();
            for _ in 0..8 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x as usize) % 0x220;
                b[i] = (x >> 32) as u8;
            }
            let _ = parse(b);
        }
    }
}
