//! `hello.so` 1.0.0: the bundled guest shared library (issue 17). It links
//! against nothing (no imports: a guest library carries what it uses), and
//! exports a function that writes a greeting into the caller's buffer, a
//! counter and a pointer to it that a live update carries over
//! (`hello2.so` is its next version, `docs/libraries.md`).
#![no_std]

/// This version's greeting.
const GREETING: &[u8] = b"hello from hello.so (call ";
/// This version, as `hello_version` says it.
const VERSION: u32 = 100;

mod body;
