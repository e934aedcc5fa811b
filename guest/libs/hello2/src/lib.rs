//! `hello2.so`: version 2.0.0 of `hello.so` (the same exports, another
//! greeting), to replace it in a running VM: `wisp update VM
//! build/libs/hello2.so --replace hello` (`docs/libraries.md`).
#![no_std]

/// This version's greeting.
const GREETING: &[u8] = b"hello from hello.so v2 (call ";
/// This version, as `hello_version` says it.
const VERSION: u32 = 200;

/// What version 2 adds (an update may add exports): a note of its own,
/// which lays its data out apart from 1.0.0's.
#[no_mangle]
pub static mut hello_v2_note: [u64; 8] = [2; 8];

#[path = "../../hello/src/body.rs"]
mod body;
