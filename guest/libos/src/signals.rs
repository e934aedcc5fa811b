//! Signals from the family: the handler table, their delivery (a handler,
//! or the default action: `SIGCHLD` is ignored, every other signal ends the
//! VM with status 128 + its number), and the family hypercall, which brings
//! the pending signals with every answer and delivers them.
//!
//! Both the family API (`family`) and the executor's event dispatch
//! (`process`) come here; this module knows neither.

use wisp_abi::family::signal::SIGCHLD;
use wisp_abi::family::{op, Call};
use wisp_abi::Hypercall;

use crate::global::Global;
use crate::hypercall;

static HANDLERS: Global<[Option<fn(u32)>; 64]> = Global::new([None; 64]);

/// Run `handler` when signal `sig` arrives (instead of the default action).
pub(crate) fn set_handler(sig: u32, handler: fn(u32)) {
    HANDLERS.with(|h| {
        if let Some(s) = h.get_mut(sig as usize) {
            *s = Some(handler);
        }
    });
}

/// One family hypercall; runs the handlers of the signals it returns.
/// Returns (ret, ret2, the signals it delivered).
pub(crate) fn family_call(opcode: u32, flg: u32, a: [u64; 4]) -> (i64, u64, u64) {
    let mut c = Call { op: opcode, flags: flg, a, ..Default::default() };
    hypercall::call(Hypercall::Family, &mut c);
    deliver(c.signals);
    (c.ret, c.ret2, c.signals)
}

/// Take and deliver pending signals (the executor calls this when the idle
/// hypercall reports `events::FAMILY`).
pub(crate) fn poll() {
    family_call(op::SIGNALS, 0, [0; 4]);
}

/// Run handlers (or default actions) for the signals in `bits`.
pub(crate) fn deliver(bits: u64) {
    if bits == 0 {
        return;
    }
    for sig in 1..64u32 {
        if bits & (1 << sig) == 0 {
            continue;
        }
        match HANDLERS.with(|h| h[sig as usize]) {
            Some(f) => f(sig),
            None if sig == SIGCHLD => {}
            None => hypercall::exit(128 + sig as i32),
        }
    }
}
