//! `hostile-lone MODE`: the `hostile` modes in an image with no features
//! (it cannot fork): a group VMM process may hold it, so the tests can put
//! a misbehaving guest among neighbours.
#![no_std]
#![no_main]

extern crate alloc;

#[path = "../modes.rs"]
mod modes;

wisp::main!(modes::main, wisp::Manifest::new().nic(false));
