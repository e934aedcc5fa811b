//! The bundled `build/libs/hello.so` (`make libs`) is read; each refusal is
//! made by changing that file where the check looks.

use super::*;

/// The bundled library as `make libs` leaves it (signed).
fn bundled() -> Vec<u8> {
    built("hello.so")
}

/// A library `make libs` built, as it is (signed).
fn built(name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/libs").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e} (`make libs` builds it)", p.display()))
}

/// Its ELF bytes (the signature's trailer cut off).
fn hello() -> Vec<u8> {
    elf_of("hello.so")
}

fn elf_of(name: &str) -> Vec<u8> {
    let b = built(name);
    sign::split(&b).expect("a good trailer").0.to_vec()
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// File offsets of the program headers of type `ty`.
fn phdrs(b: &[u8], ty: u32) -> Vec<usize> {
    let (off, n) = (u64_at(b, 32) as usize, u16_at(b, 56) as usize);
    (0..n).map(|i| off + i * 56).filter(|&p| u32::from_le_bytes(b[p..p + 4].try_into().unwrap()) == ty).collect()
}

/// A file offset of address `addr` (from the base), through the segments.
fn file_at(lib: &Library, addr: u64) -> usize {
    let s = lib.segments.iter().find(|s| addr >= s.vaddr && addr < s.vaddr + s.file_size).expect("in a segment");
    (s.offset + addr - s.vaddr) as usize
}

/// The dynamic table's entries: (file offset of the entry, tag, value).
fn dynamic(b: &[u8]) -> Vec<(usize, u64, u64)> {
    let p = phdrs(b, elf::PT_DYNAMIC)[0];
    let (off, size) = (u64_at(b, p + 8) as usize, u64_at(b, p + 32) as usize);
    (0..size / 16).map(|i| off + i * 16).map(|e| (e, u64_at(b, e), u64_at(b, e + 8))).collect()
}

fn tag(b: &[u8], t: u32) -> (usize, u64) {
    dynamic(b).into_iter().find(|&(_, tag, _)| tag == t as u64).map(|(e, _, v)| (e, v)).expect("tag present")
}

fn refused(b: &[u8]) -> String {
    match Library::parse(b) {
        Ok(_) => panic!("taken"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_bundled_library_is_read() {
    let lib = Library::parse(&hello()).expect("hello.so");
    let greet = lib.export("hello_greet").expect("hello_greet");
    assert_eq!(greet.kind, Kind::Function);
    assert_eq!(lib.export("hello_version").map(|e| e.kind), Some(Kind::Function));
    let calls = lib.export("hello_calls").expect("hello_calls");
    assert_eq!((calls.kind, calls.size), (Kind::Variable, 8));
    assert_eq!(lib.exports.len(), 5, "only what exports.map names: {:?}", lib.exports);
    assert!(lib.segments.iter().any(|s| s.exec && !s.write && greet.value >= s.vaddr && greet.value < s.vaddr + s.mem_size));
    assert!(lib.segments.iter().any(|s| s.write && calls.value >= s.vaddr && calls.value < s.vaddr + s.mem_size));
    // The counter's GOT entry: a relocation to the counter.
    assert!(lib.relocations.iter().any(|&(_, k)| k == calls.value), "{:?}", lib.relocations);
    assert!(lib.span > 0 && lib.span % 4096 == 0 && lib.span <= MAX_SPAN);
}

#[test]
fn what_is_not_a_library_for_a_guest_is_refused() {
    let good = hello();
    let lib = Library::parse(&good).unwrap();
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        refused(&b)
    };
    assert_eq!(refused(b"hello, not an ELF file at all, but long enough to be read as a header..."), "not an ELF64 file");
    assert!(refused(&good[..100]).starts_with("malformed: program headers"), "{}", refused(&good[..100]));
    assert_eq!(with(&|b| put16(b, 18, 3)), "not a library for this monitor: machine 3 (not x86-64)");
    assert!(with(&|b| put16(b, 16, elf::ET_EXEC)).starts_with("not a shared object (ELF type 2"));
    // Its stack note made an interpreter, or thread-local storage.
    let stack = phdrs(&good, elf::PT_GNU_STACK)[0];
    assert!(with(&|b| put32(b, stack, elf::PT_INTERP)).contains("interpreter"));
    assert!(with(&|b| put32(b, stack, elf::PT_TLS)).contains("thread-local storage"));
    // Its code segment made writable.
    let code = phdrs(&good, elf::PT_LOAD).into_iter().find(|&p| u32::from_le_bytes(good[p + 4..p + 8].try_into().unwrap()) & elf::PF_X != 0).unwrap();
    assert!(with(&|b| put32(b, code + 4, elf::PF_R | elf::PF_W | elf::PF_X)).contains("writable and executable"));
    // Its data moved into its code's 2 MiB page (congruent, above it).
    let loads = phdrs(&good, elf::PT_LOAD);
    let (code_vaddr, data) = (u64_at(&good, code + 16), loads[loads.iter().position(|&p| p == code).unwrap() + 1]);
    let moved = (code_vaddr & !0x1f_ffff) + 0x10_0000 + (u64_at(&good, data + 8) & 0xfff);
    assert!(with(&|b| put64(b, data + 16, moved)).contains("share a 2 MiB page"), "{}", with(&|b| put64(b, data + 16, moved)));
    // A segment past the file's end, or spanning more than a library may.
    assert!(with(&|b| put64(b, code + 32, 1 << 30)).starts_with("malformed: segment"));
    let last = *phdrs(&good, elf::PT_LOAD).last().unwrap();
    assert!(with(&|b| put64(b, last + 40, 128 << 20)).contains("more than the 64 MiB"));
    // Its soname made a needed library.
    let (soname, _) = tag(&good, elf::DT_SONAME);
    assert_eq!(with(&|b| put64(b, soname, elf::DT_NEEDED as u64)), "it needs library hello.so: a guest library links against nothing");
    assert!(with(&|b| put64(b, soname, elf::DT_TEXTREL as u64)).contains("text relocations"));
    // The counter made undefined (an import).
    let (_, symtab) = tag(&good, elf::DT_SYMTAB);
    let calls = (1..8).map(|i| file_at(&lib, symtab) + i * 24).find(|&s| {
        let name = u32::from_le_bytes(good[s..s + 4].try_into().unwrap()) as u64;
        let (_, strtab) = tag(&good, elf::DT_STRTAB);
        good[file_at(&lib, strtab + name)..].starts_with(b"hello_calls\0")
    });
    let calls = calls.expect("hello_calls in the symbol table");
    assert_eq!(with(&|b| put16(b, calls + 6, elf::SHN_UNDEF)), "symbol hello_calls is undefined: a guest library links against nothing");
    // Its relocation made another kind, or aimed at its code.
    let (_, rela) = tag(&good, elf::DT_RELA);
    let r = file_at(&lib, rela);
    assert_eq!(with(&|b| put32(b, r + 8, elf::R_X86_64_IRELATIVE)), "relocation type 37 (a library takes RELATIVE, 64, GLOB_DAT and JUMP_SLOT only)");
    let text = lib.segments.iter().find(|s| s.exec).unwrap().vaddr;
    assert!(with(&|b| put64(b, r, text)).contains("outside the writable segments"));
    // Its symbol made absolute, or its target moved past the library's end.
    assert!(with(&|b| put16(b, calls + 6, elf::SHN_ABS)).contains("an absolute symbol"));
    assert!(with(&|b| put64(b, calls + 8, lib.span + 0x1000)).contains("outside"), "{}", with(&|b| put64(b, calls + 8, lib.span + 0x1000)));
    // The dynamic table's address not where its file offset is.
    let dynp = phdrs(&good, elf::PT_DYNAMIC)[0];
    assert!(with(&|b| put64(b, dynp + 16, u64_at(&good, dynp + 16) + 8)).contains("dynamic table is not where"));
    // A tag wider than 32 bits is no tag this reads (not the end of the table).
    let (soname, _) = tag(&good, elf::DT_SONAME);
    assert!(Library::parse(&{ let mut b = good.clone(); put64(&mut b, soname, 1 << 32); b }).is_ok());
    // No symbol hash table.
    let (hash, _) = tag(&good, elf::DT_HASH);
    assert!(with(&|b| put64(b, hash, elf::DT_DEBUG as u64)).contains("no DT_HASH"));
}

/// The test key the repository signs its bundled libraries with
/// (`guest/libs/test.key`, the seed of sevens): public, for tests and
/// demos only.
fn test_key() -> ed25519_dalek::SigningKey {
    sign::key_from_seed(&[7u8; 32])
}

#[test]
fn the_bundled_library_is_signed_with_the_test_key() {
    let (_, who) = Library::read(&bundled()).expect("hello.so");
    assert_eq!(who, Some(Signed { version: "1.0.0".parse().unwrap(), key: test_key().verifying_key().to_bytes() }));
}

#[test]
fn a_signature_and_version_are_checked_before_the_library() {
    let elf = hello();
    let v: Version = "1.2.3".parse().unwrap();
    let signed = sign::sign(&elf, v, &test_key()).unwrap();
    let (lib, who) = Library::read(&signed).expect("a signed library");
    assert_eq!(who, Some(Signed { version: v, key: test_key().verifying_key().to_bytes() }));
    assert!(lib.export("hello_greet").is_some());
    assert_eq!(Library::read(&elf).unwrap().1, None, "unsigned");
    assert!(sign::sign(&signed, v, &test_key()).unwrap_err().to_string().contains("signed already"));
    // A byte of the library, or its version, changed after signing.
    let mut b = signed.clone();
    b[elf.len() / 2] ^= 1;
    assert!(Library::read(&b).unwrap_err().to_string().contains("does not verify"));
    let mut b = signed.clone();
    let at = elf.len() + 8;
    b[at] ^= 1;
    assert!(Library::read(&b).unwrap_err().to_string().contains("does not verify"));
    // The length field not matching the file.
    let mut b = signed.clone();
    let n = b.len();
    b[n - 8] ^= 1;
    assert!(Library::read(&b).unwrap_err().to_string().contains("does not fit the file"));
    assert!("1.2".parse::<Version>().is_err() && "a.b.c".parse::<Version>().is_err());
}

#[test]
fn an_image_policy_takes_only_the_keys_and_versions_it_names() {
    let ours = test_key().verifying_key().to_bytes();
    let theirs = sign::key_from_seed(&[9u8; 32]).verifying_key().to_bytes();
    let signed = |key, v: &str| Signed { version: v.parse().unwrap(), key };
    let open = Policy::default();
    assert_eq!(open.check(None), Ok(()), "no keys: unsigned libraries too");
    let strict = Policy { keys: vec![ours], min_version: Some("1.1.0".parse().unwrap()) };
    assert_eq!(strict.check(Some(&signed(ours, "1.2.0"))), Ok(()));
    assert_eq!(strict.check(Some(&signed(ours, "1.1.0"))), Ok(()));
    let refused = |p: &Policy, s: Option<&Signed>| p.check(s).unwrap_err().to_string();
    assert!(refused(&strict, None).contains("not signed"));
    assert!(refused(&strict, Some(&signed(theirs, "2.0.0"))).contains("does not trust"));
    assert!(refused(&strict, Some(&signed(ours, "1.0.9"))).contains("older than the 1.1.0"));
    assert!(refused(&Policy { keys: vec![ours], ..strict.clone() }, Some(&Signed { version: "0.9.0".parse().unwrap(), key: ours })).contains("older"));
    let versioned = Policy { keys: vec![ours], min_version: Some("1.0.0".parse().unwrap()) };
    assert!(refused(&versioned, None).contains("not signed"));
    let unsigned_versioned = Policy { keys: vec![], min_version: Some("1.0.0".parse().unwrap()) };
    assert!(refused(&unsigned_versioned, Some(&signed(theirs, "9.0.0"))).contains("means nothing without trusted keys"));
}

/// The file offset of the dynamic symbol table's entry of export `name`.
fn sym_entry(b: &[u8], name: &str) -> usize {
    let lib = Library::parse(b).unwrap();
    let e = lib.export(name).unwrap();
    let (_, symtab) = tag(b, elf::DT_SYMTAB);
    let at = file_at(&lib, symtab);
    (0..).map(|i| at + i * 24).find(|&p| u64_at(b, p + 8) == e.value && u64_at(b, p + 16) == e.size).unwrap()
}

#[test]
fn an_update_takes_only_a_binary_compatible_library() {
    let (v1, v2) = (Library::parse(&hello()).unwrap(), Library::parse(&elf_of("hello2.so")).unwrap());
    // The next version: both variables carried (the counter and its pointer).
    assert_eq!(update::Plan::new(&v1, &v2).unwrap().variables(), 2);
    // Another library: its exports are not these.
    let bench = Library::parse(&elf_of("bench.so")).unwrap();
    let e = update::Plan::new(&v1, &bench).unwrap_err().to_string();
    assert!(e.starts_with("not binary-compatible with the library it replaces: the new library has no hello_"), "{e}");
    // A variable of another size.
    let mut b = elf_of("hello2.so");
    let at = sym_entry(&b, "hello_calls");
    put64(&mut b, at + 16, 4);
    let e = update::Plan::new(&v1, &Library::parse(&b).unwrap()).unwrap_err().to_string();
    assert_eq!(e, "not binary-compatible with the library it replaces: variable hello_calls was 8 bytes and is 4 in the new library");
    // A function become a variable.
    let mut b = elf_of("hello2.so");
    let at = sym_entry(&b, "hello_version");
    b[at + 4] = (b[at + 4] & 0xf0) | elf::STT_OBJECT;
    let e = update::Plan::new(&v1, &Library::parse(&b).unwrap()).unwrap_err().to_string();
    assert_eq!(e, "not binary-compatible with the library it replaces: hello_version was a function and is a variable in the new library");
}

#[test]
fn an_update_carries_variables_and_moves_pointers_into_them() {
    let (v1, v2) = (Library::parse(&hello()).unwrap(), Library::parse(&elf_of("hello2.so")).unwrap());
    let plan = update::Plan::new(&v1, &v2).unwrap();
    let (ob, nb) = (0x1_4000_0000u64, 0x1_4400_0000u64);
    let (calls, at) = (v1.export("hello_calls").unwrap().value, v1.export("hello_where").unwrap().value);
    let (calls2, at2) = (v2.export("hello_calls").unwrap().value, v2.export("hello_where").unwrap().value);
    assert_ne!(calls, calls2, "the versions lay their data out apart");
    let mut old = vec![0u8; v1.span as usize];
    put64(&mut old, calls as usize, 42);
    put64(&mut old, at as usize, ob + calls);
    let mut new = vec![0u8; v2.span as usize];
    let c = plan.carry(&old, ob, &mut new, nb);
    assert_eq!(c, update::Carried { variables: 2, bytes: 16, pointers: 1, stale: 0 });
    assert_eq!(u64_at(&new, calls2 as usize), 42);
    assert_eq!(u64_at(&new, at2 as usize), nb + calls2, "the pointer follows the counter");
    // A pointer into the old library, not at an export: left, counted.
    put64(&mut old, at as usize, ob + 8);
    assert_eq!(plan.carry(&old, ob, &mut new, nb).stale, 1);
    // At an exported function: to the new one of that name.
    let f = v1.export("hello_greet").unwrap().value;
    put64(&mut old, at as usize, ob + f);
    plan.carry(&old, ob, &mut new, nb);
    assert_eq!(u64_at(&new, at2 as usize), nb + v2.export("hello_greet").unwrap().value);
    // Memory shorter than the plan says: nothing copied, nothing read out of it.
    assert_eq!(plan.carry(&old[..16], ob, &mut new, nb), update::Carried::default());
}
