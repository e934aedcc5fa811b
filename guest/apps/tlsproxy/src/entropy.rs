//! What rustls needs from the platform in a `no_std` guest: random bytes
//! (the provider draws on getrandom 0.2, whose source the binary registers)
//! and the time of day (certificate lifetimes and tickets).
//!
//! The random bytes come from the CPU's RDRAND, an unprivileged
//! instruction that runs in the VM without an exit on KVM. A CPU without it
//! gets a clear error at start, never a predictable key.

use rustls::pki_types::UnixTime;

/// Whether the CPU has RDRAND (CPUID leaf 1, ECX bit 30), asked once: a
/// CPUID may cost an exit to the monitor.
pub fn available() -> bool {
    use core::sync::atomic::{AtomicU8, Ordering};
    static KNOWN: AtomicU8 = AtomicU8::new(0);
    match KNOWN.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            // CPUID is unprivileged and leaf 1 exists on every x86-64 CPU.
            let yes = core::arch::x86_64::__cpuid(1).ecx & (1 << 30) != 0;
            KNOWN.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
            yes
        }
    }
}

/// One 64-bit word from RDRAND, retried as Intel advises (10 times).
fn word() -> Option<u64> {
    for _ in 0..10 {
        let mut v = 0u64;
        // SAFETY: RDRAND writes only its output register and the flags; the
        // caller checked `available()` at start (main refuses to run
        // without it).
        let ok = unsafe { core::arch::x86_64::_rdrand64_step(&mut v) };
        if ok == 1 {
            return Some(v);
        }
    }
    None
}

fn fill(buf: &mut [u8]) -> Result<(), getrandom::Error> {
    if !available() {
        return Err(getrandom::Error::UNSUPPORTED);
    }
    for chunk in buf.chunks_mut(8) {
        let w = word().ok_or(getrandom::Error::FAILED_RDRAND)?.to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
    Ok(())
}

getrandom::register_custom_getrandom!(fill);

/// The VM's wall clock for rustls.
#[derive(Debug)]
pub struct Clock;

impl rustls::time_provider::TimeProvider for Clock {
    fn current_time(&self) -> Option<UnixTime> {
        Some(UnixTime::since_unix_epoch(core::time::Duration::from_nanos(wisp::time::wall_ns())))
    }
}
