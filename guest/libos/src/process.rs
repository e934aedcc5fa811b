//! Ending the VM.

/// Exit the VM with `code` (the status `wisp run` returns).
pub fn exit(code: i32) -> ! {
    crate::hypercall::exit(code)
}

static STOP_HANDLER: crate::global::Global<Option<fn()>> = crate::global::Global::new(None);

/// Run `f` when the toolstack asks the VM to stop gracefully (`wisp stop`)
/// instead of the default, which exits with status 143 (as SIGTERM would).
pub fn on_stop(f: fn()) {
    STOP_HANDLER.with(|h| *h = Some(f));
}

/// Tasks waiting for standard input (`stdin::read_line_async`), woken by
/// the `STDIN` event.
pub(crate) static STDIN_READERS: crate::global::Global<alloc::vec::Vec<core::task::Waker>> =
    crate::global::Global::new(alloc::vec::Vec::new());

/// Act on event bits returned by the idle hypercall. `events::NET` (frames
/// arrived, or TX room) needs nothing here: the executor polls the network
/// after every wake-up, whatever woke it.
pub(crate) fn dispatch_events(bits: u64) {
    if bits & wisp_abi::events::FAMILY != 0 {
        crate::signals::poll();
    }
    if bits & wisp_abi::events::STDIN != 0 {
        for w in STDIN_READERS.with(core::mem::take) {
            w.wake();
        }
    }
    if bits & wisp_abi::events::STOP != 0 {
        match STOP_HANDLER.with(|h| *h) {
            Some(f) => f(),
            None => exit(143),
        }
    }
}

/// What an app's `main` may return.
pub trait ExitCode {
    /// The exit code.
    fn code(self) -> i32;
}

impl ExitCode for () {
    fn code(self) -> i32 {
        0
    }
}

impl ExitCode for i32 {
    fn code(self) -> i32 {
        self
    }
}

impl<E: core::fmt::Display> ExitCode for Result<(), E> {
    fn code(self) -> i32 {
        match self {
            Ok(()) => 0,
            Err(e) => {
                crate::eprintln!("error: {}", e);
                1
            }
        }
    }
}
