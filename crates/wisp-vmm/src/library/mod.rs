//! Guest shared libraries (issue 17): ELF shared objects built against the
//! library OS (`make libs`: a staticlib of position-independent objects
//! linked `-shared` by rust-lld, `docs/libraries.md`), checked here before
//! anything of them is mapped into a guest.
//!
//! The `object` crate reads the ELF structures (file header, program
//! headers, the dynamic table, symbols, RELA entries); what a loader
//! follows is the dynamic table, not the section headers (which a library
//! need not have), and every address and size it names is checked against
//! the loadable segments here: the file is untrusted.
//!
//! What a library may be: ELF64, little-endian, x86-64, `ET_DYN`; no
//! interpreter, no needed libraries (it links against nothing: a guest
//! library carries what it uses), no thread-local storage, no text
//! relocations; loadable segments page-congruent, inside the file, not
//! overlapping, none writable and executable, those with other permissions
//! in 2 MiB pages of their own (`rust-lld -z max-page-size=0x200000`; the
//! monitor maps a library with 2 MiB pages), spanning at most [`MAX_SPAN`]; a `DT_HASH` symbol table whose symbols are all defined in
//! it; relocations only of the kinds that resolve to an address inside it
//! (`RELATIVE`, `64`, `GLOB_DAT`, `JUMP_SLOT`), each landing in a writable
//! segment. So once placed at a base, every relocation is `base + k`.

use object::elf;
use object::read::elf::{Dyn as _, FileHeader, ProgramHeader as _, Rela as _, Sym as _};
use object::{Endianness, Pod};

use crate::error::LibraryError as Refused;

pub mod restrict;
pub mod sign;
pub mod update;
#[cfg(test)]
mod tests;

pub use sign::{Policy, Signed, Version};

/// Most bytes of address space a library's segments may span.
pub const MAX_SPAN: u64 = 64 << 20;
/// Most symbols and relocations a library may have.
const MAX_ENTRIES: usize = 1 << 20;
const PAGE: u64 = 4096;
/// The pages a library is mapped with in a guest.
const LARGE_PAGE: u64 = 2 << 20;
/// Packed relative relocations (not among `object`'s constants).
const DT_RELR: u32 = 36;

/// A loadable segment: where it goes (from the library's base), what of the
/// file it holds, and its permissions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub vaddr: u64,
    pub mem_size: u64,
    pub offset: u64,
    pub file_size: u64,
    pub write: bool,
    pub exec: bool,
}

/// What an exported symbol is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Function,
    Variable,
}

/// A symbol the library exports (defined in it, global or weak).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    pub name: String,
    pub kind: Kind,
    /// Its address, from the library's base.
    pub value: u64,
    pub size: u64,
}

/// A checked library.
#[derive(Clone, Debug)]
pub struct Library {
    pub segments: Vec<Segment>,
    /// Bytes of address space from its base to its last segment's end
    /// (page-aligned).
    pub span: u64,
    pub exports: Vec<Export>,
    /// Relocations, each `(offset, k)`: at `base + offset` goes `base + k`.
    pub relocations: Vec<(u64, u64)>,
}

type E = Endianness;

impl Library {
    /// Check `b`, a shared object's bytes, as the module says.
    pub fn parse(b: &[u8]) -> Result<Library, Refused> {
        let header = elf::FileHeader64::<E>::parse(b).map_err(|_| Refused::NotElf)?;
        let endian = header.endian().map_err(|_| Refused::NotElf)?;
        if endian != Endianness::Little {
            return Err(Refused::Format("big-endian".into()));
        }
        if header.e_machine(endian) != elf::EM_X86_64 {
            return Err(Refused::Format(format!("machine {} (not x86-64)", header.e_machine(endian))));
        }
        if header.e_type(endian) != elf::ET_DYN {
            return Err(Refused::NotShared(header.e_type(endian)));
        }
        let phdrs = header.program_headers(endian, b).map_err(|e| Refused::Malformed(format!("program headers: {e}")))?;
        let mut segments = Vec::new();
        let mut dynamic = None;
        for (i, ph) in phdrs.iter().enumerate() {
            let (offset, filesz, vaddr, memsz) = (ph.p_offset(endian), ph.p_filesz(endian), ph.p_vaddr(endian), ph.p_memsz(endian));
            match ph.p_type(endian) {
                elf::PT_INTERP => return Err(Refused::Interpreter),
                elf::PT_TLS => return Err(Refused::Format("thread-local storage (PT_TLS)".into())),
                elf::PT_DYNAMIC => {
                    dynamic = Some((ph.dynamic(endian, b).map_err(|e| Refused::Malformed(format!("dynamic table: {e}")))?, offset, vaddr, filesz));
                }
                elf::PT_LOAD => {
                    let flags = ph.p_flags(endian);
                    let (write, exec) = (flags & elf::PF_W != 0, flags & elf::PF_X != 0);
                    if write && exec {
                        return Err(Refused::WritableCode(i));
                    }
                    let end = vaddr.checked_add(memsz).ok_or_else(|| Refused::Malformed(format!("segment {i} wraps")))?;
                    if filesz > memsz || offset.checked_add(filesz).is_none_or(|e| e > b.len() as u64) || vaddr % PAGE != offset % PAGE {
                        return Err(Refused::Malformed(format!("segment {i}: {filesz:#x} bytes at file offset {offset:#x} to {vaddr:#x}+{memsz:#x}")));
                    }
                    if end > MAX_SPAN {
                        return Err(Refused::TooBig(end));
                    }
                    if let Some(prev) = segments.last().map(|s: &Segment| s.vaddr + s.mem_size) {
                        if vaddr < prev {
                            return Err(Refused::Malformed(format!("segment {i} at {vaddr:#x} is not above the one before (ends {prev:#x})")));
                        }
                    }
                    segments.push(Segment { vaddr, mem_size: memsz, offset, file_size: filesz, write, exec });
                }
                _ => {}
            }
        }
        if segments.is_empty() {
            return Err(Refused::Malformed("no loadable segment".into()));
        }
        // A guest maps a library with 2 MiB pages, each with one segment's
        // permissions: segments that differ may not share one.
        for (i, w) in segments.windows(2).enumerate() {
            let (a, b) = (&w[0], &w[1]);
            let shared = (a.vaddr + a.mem_size).saturating_sub(1) / LARGE_PAGE >= b.vaddr / LARGE_PAGE;
            if shared && (a.write, a.exec) != (b.write, b.exec) {
                return Err(Refused::SharedPage(i, i + 1));
            }
        }
        let span = segments.last().map(|s| (s.vaddr + s.mem_size).next_multiple_of(PAGE)).unwrap_or(0);
        let lib = Layout { b, segments: &segments };
        let (dynamic, dyn_off, dyn_vaddr, dyn_size) = dynamic.and_then(|(d, o, v, s)| d.map(|d| (d, o, v, s))).ok_or_else(|| Refused::Malformed("no dynamic table".into()))?;
        // Where a loader finds it (by address) is where it was read (by
        // file offset).
        if !segments.iter().any(|s| dyn_vaddr >= s.vaddr && dyn_vaddr.checked_add(dyn_size).is_some_and(|e| e <= s.vaddr + s.file_size) && dyn_vaddr - s.vaddr == dyn_off.wrapping_sub(s.offset)) {
            return Err(Refused::Malformed("the dynamic table is not where its segment puts it".into()));
        }
        let mut tags = Tags::default();
        for d in dynamic {
            let (tag, val) = (d.d_tag(endian), d.d_val(endian));
            // Every tag this reads is below 2^32: a wider one is none of them.
            let Ok(tag) = u32::try_from(tag) else { continue };
            match tag {
                elf::DT_NULL => break,
                elf::DT_NEEDED => tags.needed = Some(val),
                elf::DT_TEXTREL => return Err(Refused::Format("text relocations (DT_TEXTREL)".into())),
                elf::DT_FLAGS if val & elf::DF_TEXTREL as u64 != 0 => return Err(Refused::Format("text relocations (DF_TEXTREL)".into())),
                elf::DT_HASH => tags.hash = Some(val),
                elf::DT_SYMTAB => tags.symtab = Some(val),
                elf::DT_STRTAB => tags.strtab = Some(val),
                elf::DT_STRSZ => tags.strsz = val,
                elf::DT_SYMENT if val != 24 => return Err(Refused::Malformed(format!("symbols of {val} bytes"))),
                elf::DT_RELA => tags.rela = Some(val),
                elf::DT_RELASZ => tags.relasz = val,
                elf::DT_RELAENT if val != 24 => return Err(Refused::Malformed(format!("relocations of {val} bytes"))),
                elf::DT_JMPREL => tags.jmprel = Some(val),
                elf::DT_PLTRELSZ => tags.pltrelsz = val,
                elf::DT_PLTREL if val != elf::DT_RELA as u64 => return Err(Refused::Format("REL relocations (only RELA)".into())),
                elf::DT_REL | DT_RELR => return Err(Refused::Format("REL or RELR relocations (only RELA)".into())),
                _ => {}
            }
        }
        let strtab = lib.bytes(tags.strtab.ok_or_else(|| Refused::Malformed("no string table".into()))?, tags.strsz, "string table")?;
        if let Some(off) = tags.needed {
            return Err(Refused::Needs(cstr(strtab, off).unwrap_or("?").to_string()));
        }
        // The symbol count: DT_HASH's chain count.
        let hash = lib.bytes(tags.hash.ok_or_else(|| Refused::Format("no DT_HASH symbol hash table".into()))?, 8, "hash table")?;
        let nsyms = u32::from_le_bytes(hash[4..8].try_into().expect("4 bytes")) as usize;
        if nsyms > MAX_ENTRIES {
            return Err(Refused::Malformed(format!("{nsyms} symbols")));
        }
        let symtab = tags.symtab.ok_or_else(|| Refused::Malformed("no symbol table".into()))?;
        let syms: &[elf::Sym64<E>] = lib.table(symtab, nsyms, "symbol table")?;
        let mut exports = Vec::new();
        for (i, s) in syms.iter().enumerate().skip(1) {
            let name = cstr(strtab, s.st_name(endian) as u64).ok_or_else(|| Refused::Malformed(format!("symbol {i}'s name")))?;
            if s.st_shndx(endian) == elf::SHN_UNDEF {
                return Err(Refused::Undefined(name.to_string()));
            }
            let kind = match s.st_type() {
                elf::STT_FUNC => Kind::Function,
                elf::STT_OBJECT => Kind::Variable,
                _ => continue,
            };
            if !matches!(s.st_bind(), elf::STB_GLOBAL | elf::STB_WEAK) {
                continue;
            }
            let (value, size) = (s.st_value(endian), s.st_size(endian));
            if !segments.iter().any(|g| value >= g.vaddr && value.checked_add(size).is_some_and(|e| e <= g.vaddr + g.mem_size)) {
                return Err(Refused::Malformed(format!("symbol {name} at {value:#x}+{size:#x} is outside the segments")));
            }
            exports.push(Export { name: name.to_string(), kind, value, size });
        }
        let mut relocations = Vec::new();
        for (at, size) in [(tags.rela, tags.relasz), (tags.jmprel, tags.pltrelsz)] {
            let Some(at) = at else { continue };
            if size % 24 != 0 || size / 24 > MAX_ENTRIES as u64 {
                return Err(Refused::Malformed(format!("{size} bytes of relocations")));
            }
            let relas: &[elf::Rela64<E>] = lib.table(at, (size / 24) as usize, "relocations")?;
            for r in relas {
                let (off, addend) = (r.r_offset(endian), r.r_addend(endian) as u64);
                if !segments.iter().any(|g| g.write && off >= g.vaddr && off.checked_add(8).is_some_and(|e| e <= g.vaddr + g.mem_size)) {
                    return Err(Refused::Malformed(format!("a relocation at {off:#x} is outside the writable segments")));
                }
                let k = match r.r_type(endian, false) {
                    elf::R_X86_64_RELATIVE => addend,
                    t @ (elf::R_X86_64_64 | elf::R_X86_64_GLOB_DAT | elf::R_X86_64_JUMP_SLOT) => {
                        let n = r.r_sym(endian, false) as usize;
                        let s = syms.get(n).filter(|_| n != 0).ok_or_else(|| Refused::Malformed(format!("relocation at {off:#x}: symbol {n}")))?;
                        if s.st_shndx(endian) == elf::SHN_ABS {
                            return Err(Refused::Malformed(format!("relocation at {off:#x}: an absolute symbol")));
                        }
                        let value = s.st_value(endian);
                        if t == elf::R_X86_64_64 { value.wrapping_add(addend) } else { value }
                    }
                    t => return Err(Refused::Relocation(t)),
                };
                // base + k is an address inside the library.
                if k >= span {
                    return Err(Refused::Malformed(format!("a relocation at {off:#x} points at {k:#x}, outside the library")));
                }
                relocations.push((off, k));
            }
        }
        Ok(Library { segments, span, exports, relocations })
    }

    /// A library file as it is kept (ELF bytes, then a signature trailer
    /// if it is signed): the signature checked first, then the ELF; the
    /// library, and who signed it.
    pub fn read(file: &[u8]) -> Result<(Library, Option<Signed>), Refused> {
        let (elf, signed) = sign::split(file)?;
        Ok((Library::parse(elf)?, signed))
    }

    /// The export named `name`.
    pub fn export(&self, name: &str) -> Option<&Export> {
        self.exports.iter().find(|e| e.name == name)
    }
}

/// The dynamic tags a loader follows.
#[derive(Default)]
struct Tags {
    needed: Option<u64>,
    hash: Option<u64>,
    symtab: Option<u64>,
    strtab: Option<u64>,
    strsz: u64,
    rela: Option<u64>,
    relasz: u64,
    jmprel: Option<u64>,
    pltrelsz: u64,
}

/// The file seen through its segments: an address (from the base) to the
/// file's bytes there.
struct Layout<'a> {
    b: &'a [u8],
    segments: &'a [Segment],
}

impl<'a> Layout<'a> {
    /// `len` bytes of the file at address `addr`, which must lie in one
    /// segment's file part.
    fn bytes(&self, addr: u64, len: u64, what: &str) -> Result<&'a [u8], Refused> {
        let s = self
            .segments
            .iter()
            .find(|s| addr >= s.vaddr && addr.checked_add(len).is_some_and(|e| e <= s.vaddr + s.file_size))
            .ok_or_else(|| Refused::Malformed(format!("the {what} at {addr:#x}+{len:#x} is not in the file's segments")))?;
        let at = (s.offset + (addr - s.vaddr)) as usize;
        Ok(&self.b[at..at + len as usize])
    }

    /// `n` entries of type `T` at address `addr`.
    fn table<T: Pod>(&self, addr: u64, n: usize, what: &str) -> Result<&'a [T], Refused> {
        let bytes = self.bytes(addr, (n * std::mem::size_of::<T>()) as u64, what)?;
        object::pod::slice_from_bytes(bytes, n).map(|(t, _)| t).map_err(|_| Refused::Malformed(format!("the {what} at {addr:#x} is misaligned")))
    }
}

/// The NUL-terminated UTF-8 string at `off` of `strtab`.
fn cstr(strtab: &[u8], off: u64) -> Option<&str> {
    let s = strtab.get(off as usize..)?;
    let end = s.iter().position(|&c| c == 0)?;
    std::str::from_utf8(&s[..end]).ok()
}
