//! Symbol lookup in a guest shared library as the monitor maps it (issue
//! 17): its segments at their addresses from its base, its dynamic table,
//! symbol table, strings and SysV hash table (`DT_HASH`) where they say.
//! The library OS binds a call to a library's function on the first call
//! by looking its name up here (lazy binding), and again after a live
//! update.
//!
//! The monitor checked the library before it mapped it
//! (`wisp_vmm::library`), but nothing here trusts that: every read is
//! bounds-checked against the mapping, and a hash chain is followed at most
//! as many steps as there are symbols, so a library that lies gets `None`,
//! never a fault or a hang.
//!
//! Hand-written rather than with an ELF crate: it runs in the guest
//! (`no_std`, no allocator) and reads four tags and two tables.
#![no_std]

/// What a symbol is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Function,
    Variable,
}

/// A symbol found: its address from the library's base, size and kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub value: u64,
    pub size: u64,
    pub kind: Kind,
}

/// A mapped library: its address space from its base.
pub struct Library<'a> {
    mem: &'a [u8],
    symtab: u64,
    strtab: u64,
    strsz: u64,
    hash: u64,
}

const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_HASH: u64 = 4;
const DT_STRTAB: u64 = 5;
const DT_SYMTAB: u64 = 6;
const DT_STRSZ: u64 = 10;
const SYM_SIZE: u64 = 24;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
/// Most dynamic entries read.
const MAX_DYN: u64 = 1024;

fn u32_at(m: &[u8], at: u64) -> Option<u32> {
    let at = usize::try_from(at).ok()?;
    Some(u32::from_le_bytes(m.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn u64_at(m: &[u8], at: u64) -> Option<u64> {
    let at = usize::try_from(at).ok()?;
    Some(u64::from_le_bytes(m.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

/// The classic ELF (SysV) hash of a symbol name.
pub fn elf_hash(name: &[u8]) -> u32 {
    let mut h: u32 = 0;
    for &c in name {
        h = (h << 4).wrapping_add(c as u32);
        let g = h & 0xf000_0000;
        if g != 0 {
            h ^= g >> 24;
        }
        h &= !g;
    }
    h
}

impl<'a> Library<'a> {
    /// The library mapped in `mem` (from its base to the end of its last
    /// segment), if it is an ELF64 shared object with the tables a lookup
    /// needs.
    pub fn new(mem: &'a [u8]) -> Option<Library<'a>> {
        if mem.get(..4)? != b"\x7fELF" || *mem.get(4)? != 2 {
            return None;
        }
        let phoff = u64_at(mem, 32)?;
        let phnum = u16::from_le_bytes(mem.get(56..58)?.try_into().ok()?) as u64;
        let dynamic = (0..phnum).map(|i| phoff + i * 56).find(|&p| u32_at(mem, p) == Some(PT_DYNAMIC))?;
        let dyn_at = u64_at(mem, dynamic + 16)?;
        let (mut symtab, mut strtab, mut strsz, mut hash) = (None, None, 0, None);
        for i in 0..MAX_DYN {
            let e = dyn_at.checked_add(i * 16)?;
            let (tag, val) = (u64_at(mem, e)?, u64_at(mem, e + 8)?);
            match tag {
                DT_NULL => break,
                DT_HASH => hash = Some(val),
                DT_STRTAB => strtab = Some(val),
                DT_SYMTAB => symtab = Some(val),
                DT_STRSZ => strsz = val,
                _ => {}
            }
        }
        Some(Library { mem, symtab: symtab?, strtab: strtab?, strsz, hash: hash? })
    }

    /// The exported function or variable named `name`.
    pub fn lookup(&self, name: &str) -> Option<Symbol> {
        let m = self.mem;
        let (nbucket, nchain) = (u32_at(m, self.hash)? as u64, u32_at(m, self.hash + 4)? as u64);
        if nbucket == 0 {
            return None;
        }
        let buckets = self.hash + 8;
        let chains = buckets.checked_add(nbucket.checked_mul(4)?)?;
        let mut i = u32_at(m, buckets + (elf_hash(name.as_bytes()) as u64 % nbucket) * 4)? as u64;
        // At most one step per symbol: a chain that loops ends here.
        for _ in 0..nchain {
            if i == 0 || i >= nchain {
                return None;
            }
            let s = self.symtab.checked_add(i.checked_mul(SYM_SIZE)?)?;
            if self.name_is(u32_at(m, s)? as u64, name.as_bytes()) {
                let info = *m.get(usize::try_from(s + 4).ok()?)?;
                let shndx = u16::from_le_bytes(m.get(usize::try_from(s + 6).ok()?..usize::try_from(s + 8).ok()?)?.try_into().ok()?);
                let kind = match info & 0xf {
                    STT_FUNC => Kind::Function,
                    STT_OBJECT => Kind::Variable,
                    _ => return None,
                };
                // Defined here, global or weak.
                if shndx == 0 || info >> 4 == 0 {
                    return None;
                }
                return Some(Symbol { value: u64_at(m, s + 8)?, size: u64_at(m, s + 16)?, kind });
            }
            i = u32_at(m, chains + i * 4)? as u64;
        }
        None
    }

    /// Whether the string at `off` of the string table is `name`.
    fn name_is(&self, off: u64, name: &[u8]) -> bool {
        let len = name.len() as u64;
        if off.checked_add(len).is_none_or(|end| end >= self.strsz) {
            return false;
        }
        let at = self.strtab + off;
        let (Ok(a), Ok(b)) = (usize::try_from(at), usize::try_from(at + len)) else { return false };
        self.mem.get(a..b) == Some(name) && self.mem.get(b) == Some(&0)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    /// build/libs/hello.so laid out as the monitor maps it: each loadable
    /// segment's file bytes at its address.
    fn mapped() -> Vec<u8> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../build/libs/hello.so");
        let f = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e} (`make libs` builds it)", p.display()));
        let (phoff, phnum) = (u64_at(&f, 32).unwrap(), u16::from_le_bytes(f[56..58].try_into().unwrap()) as u64);
        let loads: Vec<(u64, u64, u64, u64)> = (0..phnum)
            .map(|i| phoff + i * 56)
            .filter(|&p| u32_at(&f, p) == Some(1))
            .map(|p| (u64_at(&f, p + 8).unwrap(), u64_at(&f, p + 16).unwrap(), u64_at(&f, p + 32).unwrap(), u64_at(&f, p + 40).unwrap()))
            .collect();
        let span = loads.iter().map(|&(_, v, _, m)| v + m).max().unwrap() as usize;
        let mut mem = std::vec![0u8; span];
        for (off, vaddr, filesz, _) in loads {
            mem[vaddr as usize..(vaddr + filesz) as usize].copy_from_slice(&f[off as usize..(off + filesz) as usize]);
        }
        mem
    }

    #[test]
    fn the_bundled_library_s_symbols_are_found_by_name() {
        let mem = mapped();
        let lib = Library::new(&mem).expect("a library");
        let greet = lib.lookup("hello_greet").expect("hello_greet");
        assert_eq!(greet.kind, Kind::Function);
        let calls = lib.lookup("hello_calls").expect("hello_calls");
        assert_eq!((calls.kind, calls.size), (Kind::Variable, 8));
        assert_eq!(lib.lookup("hello_version").map(|s| s.kind), Some(Kind::Function));
        for missing in ["hello", "hello_greeT", "", "hello_greet_"] {
            assert_eq!(lib.lookup(missing), None, "{missing:?}");
        }
    }

    #[test]
    fn a_library_that_lies_gets_none_not_a_fault_or_a_hang() {
        let good = mapped();
        assert!(Library::new(&good[..100]).is_none(), "cut before its tables");
        assert!(Library::new(b"not an ELF at all").is_none());
        // Every byte of the first 4 KiB flipped in turn, and the mapping
        // cut at every 97th byte: lookups end, whatever they find.
        for i in 0..4096.min(good.len()) {
            let mut m = good.clone();
            m[i] ^= 0xff;
            if let Some(lib) = Library::new(&m) {
                let _ = lib.lookup("hello_greet");
            }
        }
        for cut in (0..good.len()).step_by(97) {
            if let Some(lib) = Library::new(&good[..cut]) {
                let _ = lib.lookup("hello_calls");
            }
        }
    }

    #[test]
    fn the_hash_is_the_sysv_one() {
        assert_eq!(elf_hash(b""), 0);
        assert_eq!(elf_hash(b"printf"), 0x077905a6);
        assert_eq!(elf_hash(b"exit"), 0x0006cf04);
    }
}
