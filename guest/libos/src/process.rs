//! Ending the VM.

/// Exit the VM with `code` (the status `wisp run` returns).
pub fn exit(code: i32) -> ! {
    crate::hypercall::exit(code)
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
                crate::println!("error: {}", e);
                1
            }
        }
    }
}
