//! `hostile MODE`: a test image that misbehaves on purpose, to prove the
//! monitor stops such a guest with a clear reason and stays healthy.
//! Also a few well-behaved modes that test the library OS itself
//! (`modes.rs`).
#![no_std]
#![no_main]

extern crate alloc;

#[path = "modes.rs"]
mod modes;

wisp::main!(modes::main, wisp::Manifest::new().features(wisp::features::ALL).nic(false));
