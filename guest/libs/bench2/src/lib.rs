//! `bench2.so` 2.0.0: the next version of `bench.so` (its functions add
//! twice as much), for the live-update benchmark.
#![no_std]

/// What each function adds per unit.
const STEP: u64 = 2;
/// This version, as `bench_version` says it.
const VERSION: u32 = 200;

#[path = "../../bench/src/body.rs"]
mod body;
