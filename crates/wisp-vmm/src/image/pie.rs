//! Position-independent images: a static PIE (`ET_DYN` with no interpreter
//! and no needed libraries, what `cargo build --target x86_64-unknown-none`
//! links by default) is turned into the static executable the loader takes,
//! placed at [`IMAGE_BASE`]: its relative relocations applied, its entry and
//! program headers moved, its type made `ET_EXEC`. The result is an image
//! file like any other (the daemon's image cache holds it, a VMM process
//! parses it again unchanged), so no build setting is needed to make a wisp
//! image and nothing is relocated at boot.
//!
//! Hand-written rather than with an ELF crate: it reads six dynamic tags and
//! one relocation type, on bytes already checked by [`super::Image::parse`],
//! and every offset it follows is checked here (the file is untrusted).

use wisp_abi::layout::{IMAGE_BASE, PAGE_SIZE};

use super::{bad, u16_at, u32_at, u64_at, PHDR_SIZE, PT_INTERP, PT_LOAD};
use crate::error::Result;

const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_PLTRELSZ: u64 = 2;
const DT_RELA: u64 = 7;
const DT_RELASZ: u64 = 8;
const DT_RELAENT: u64 = 9;
const DT_RELSZ: u64 = 18;
const DT_RELRSZ: u64 = 35;
const R_X86_64_NONE: u32 = 0;
const R_X86_64_RELATIVE: u32 = 8;
const RELA_SIZE: u64 = 24;
/// Most relocations applied (a 256 MiB file of nothing else would have
/// 11 M, each looked up among the segments).
const MAX_RELOCATIONS: u64 = 1 << 20;

/// A PIE as the static executable at [`IMAGE_BASE`] it becomes, and the
/// number of relocations applied. `b` is an `ET_DYN` ELF64 x86-64 file
/// whose program-header table lies inside it (checked by the caller).
pub(super) fn relocate(b: &[u8]) -> Result<(Vec<u8>, usize)> {
    let phoff = u64_at(b, 32) as usize;
    let phnum = u16_at(b, 56) as usize;
    let ph = |i: usize| phoff + i * PHDR_SIZE;
    // Loadable parts of the file: (vaddr, file offset, file size).
    let mut loads = Vec::new();
    let mut dynamic = None;
    let mut lowest = u64::MAX;
    for i in 0..phnum {
        let p = ph(i);
        let (t, offset, vaddr, filesz, memsz) = (u32_at(b, p), u64_at(b, p + 8), u64_at(b, p + 16), u64_at(b, p + 32), u64_at(b, p + 40));
        match t {
            PT_INTERP => return bad("dynamically linked (PT_INTERP): wisp images are static"),
            PT_LOAD if memsz > 0 => {
                lowest = lowest.min(vaddr);
                loads.push((vaddr, offset, filesz));
            }
            PT_DYNAMIC => dynamic = Some((offset, filesz)),
            _ => {}
        }
    }
    if lowest == u64::MAX {
        return bad("no loadable segments");
    }
    if lowest & !(PAGE_SIZE - 1) > IMAGE_BASE {
        return bad(format!("position-independent image linked at {lowest:#x}, above the image base {IMAGE_BASE:#x}"));
    }
    let bias = IMAGE_BASE - (lowest & !(PAGE_SIZE - 1));
    // File offset of `len` bytes at `vaddr`, if they lie in a segment's file part.
    let file_at = |vaddr: u64, len: u64| -> Option<usize> {
        loads.iter().find_map(|&(va, off, fsz)| {
            let d = vaddr.checked_sub(va)?;
            let end = d.checked_add(len)?;
            (end <= fsz).then(|| off.checked_add(d)).flatten().filter(|o| o.checked_add(len).is_some_and(|e| e <= b.len() as u64))
        })
        .map(|o| o as usize)
    };
    let headers_end = phoff.max(64) + phnum * PHDR_SIZE;
    let mut out = b.to_vec();
    let mut applied = 0;
    if let Some((off, size)) = dynamic {
        if off.checked_add(size).is_none_or(|e| e > b.len() as u64) {
            return bad("the dynamic section extends past the end of the file (truncated?)");
        }
        let (mut rela, mut relasz, mut relaent) = (None, 0u64, RELA_SIZE);
        for e in b[off as usize..(off + size) as usize].chunks_exact(16) {
            let (tag, val) = (u64_at(e, 0), u64_at(e, 8));
            match tag {
                DT_NULL => break,
                DT_NEEDED => return bad("needs shared libraries (DT_NEEDED): wisp images are static"),
                DT_RELA => rela = Some(val),
                DT_RELASZ => relasz = val,
                DT_RELAENT => relaent = val,
                DT_PLTRELSZ | DT_RELSZ if val > 0 => {
                    return bad("has PLT or REL relocations: not a static position-independent executable")
                }
                DT_RELRSZ if val > 0 => {
                    return bad("has packed relative relocations (DT_RELR): link without -z pack-relative-relocs")
                }
                _ => {}
            }
        }
        if relasz > 0 {
            if relaent != RELA_SIZE || relasz % RELA_SIZE != 0 {
                return bad(format!("relocation table of {relasz} bytes in entries of {relaent}: expected entries of {RELA_SIZE}"));
            }
            if relasz / RELA_SIZE > MAX_RELOCATIONS {
                return bad(format!("{} relocations, more than {MAX_RELOCATIONS}", relasz / RELA_SIZE));
            }
            let table = rela
                .and_then(|va| file_at(va, relasz))
                .ok_or_else(|| crate::error::Error::BadImage("the relocation table is not inside the file's segments".into()))?;
            for (i, r) in b[table..table + relasz as usize].chunks_exact(RELA_SIZE as usize).enumerate() {
                let (at, info, addend) = (u64_at(r, 0), u64_at(r, 8), u64_at(r, 16));
                match info as u32 {
                    R_X86_64_NONE => {}
                    R_X86_64_RELATIVE => {
                        let Some(o) = file_at(at, 8) else {
                            return bad(format!("relocation {i} at {at:#x} is outside the file's segments"));
                        };
                        // The headers are rewritten below from the file's
                        // own: a relocation may not change them first.
                        if o < headers_end {
                            return bad(format!("relocation {i} at {at:#x} writes into the ELF headers"));
                        }
                        out[o..o + 8].copy_from_slice(&addend.wrapping_add(bias).to_le_bytes());
                        applied += 1;
                    }
                    t => {
                        return bad(format!(
                            "relocation {i} is of type {t}: a position-independent wisp image may only have relative ones (is it static?)"
                        ))
                    }
                }
            }
        }
    }
    // Now a static executable at the image base.
    out[16..18].copy_from_slice(&2u16.to_le_bytes());
    let entry = u64_at(b, 24).wrapping_add(bias);
    out[24..32].copy_from_slice(&entry.to_le_bytes());
    for i in 0..phnum {
        let p = ph(i);
        if u32_at(b, p) == PT_LOAD || u64_at(b, p + 40) != 0 {
            for f in [p + 16, p + 24] {
                let v = u64_at(b, f).wrapping_add(bias);
                out[f..f + 8].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    Ok((out, applied))
}
