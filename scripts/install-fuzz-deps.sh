#!/usr/bin/env bash
# Installs what `make fuzz` needs, idempotently: a nightly toolchain (cargo-fuzz
# builds with sanitizer flags only nightly accepts) and cargo-fuzz from crates.io.
set -euo pipefail

if ! command -v rustup >/dev/null; then
    echo "install-fuzz-deps: rustup not found; install Rust with rustup first" >&2
    exit 1
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi
