//! `bench.so` 1.0.0: the library of the live-update and memory benchmarks
//! (`make bench-libs`, `docs/benchmarks.md`); `bench2.so` is its next
//! version.
#![no_std]

/// What each function adds per unit.
const STEP: u64 = 1;
/// This version, as `bench_version` says it.
const VERSION: u32 = 100;

mod body;
