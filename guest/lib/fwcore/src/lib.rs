//! The personal firewall's core (`guest/apps/firewall`): its rules
//! language ([`rules`]), the decision on a packet ([`filter`]) and the
//! forwarding between the client's link and the uplink ([`router`]). A
//! crate of its own (`no_std`, no wisp-libos) so that `make test` tests it
//! on the host and `wisp` checks a rules file before a VM boots with it.
#![cfg_attr(not(test), no_std)]

extern crate alloc;

pub mod filter;
pub mod router;
pub mod rules;

#[cfg(test)]
mod tests;
