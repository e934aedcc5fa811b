//! How a VM's end becomes an exit status, the one mapping for `wisp run`
//! (with or without the daemon), `wisp wait` and `exit.json`: the guest's
//! own code, [`TIMEOUT`], [`KILLED`] or [`STOPPED`]; [`ERROR`] when the VM
//! could not be started.

use wisp_api::ExitInfo;
use wisp_vmm::{Outcome, StopReason};

/// `--timeout` ended the VM (as timeout(1)).
pub const TIMEOUT: u8 = 124;
/// wisp could not do what was asked (e.g. start the VM).
pub const ERROR: u8 = 125;
/// The VM was killed (128 + SIGKILL).
pub const KILLED: u8 = 137;
/// The monitor stopped a misbehaving guest (128 + SIGSEGV).
pub const STOPPED: u8 = 139;

/// Who runs the VM, which decides how a kill is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runner {
    /// A VMM process of wispd: a kill (through the toolstack or by a family
    /// member's SIGKILL) is [`KILLED`].
    Daemon,
    /// `wisp run` without a daemon: every stop, a kill from the family
    /// included, is [`STOPPED`] (as it has always been reported there).
    Direct,
}

/// Exit status and reason for an outcome.
pub fn exit_info(outcome: &Outcome, runner: Runner) -> ExitInfo {
    match outcome {
        Outcome::Exited(c) => ExitInfo { code: c & 0xff, reason: "exited".into() },
        Outcome::Stopped(r @ StopReason::Timeout) => ExitInfo { code: TIMEOUT.into(), reason: r.to_string() },
        Outcome::Stopped(StopReason::Killed) if runner == Runner::Daemon => {
            ExitInfo { code: KILLED.into(), reason: "killed".into() }
        }
        Outcome::Stopped(r) => ExitInfo { code: STOPPED.into(), reason: r.to_string() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_map_to_statuses() {
        let code = |o: &Outcome, r| exit_info(o, r).code;
        for r in [Runner::Daemon, Runner::Direct] {
            assert_eq!(exit_info(&Outcome::Exited(3), r), ExitInfo { code: 3, reason: "exited".into() });
            assert_eq!(code(&Outcome::Exited(-1), r), 255);
            assert_eq!(code(&Outcome::Exited(256 + 7), r), 7);
            assert_eq!(code(&Outcome::Stopped(StopReason::Timeout), r), 124);
            assert_eq!(code(&Outcome::Stopped(StopReason::TripleFault), r), 139);
            assert_eq!(exit_info(&Outcome::Stopped(StopReason::Killed), r).reason, "killed");
        }
        assert_eq!(code(&Outcome::Stopped(StopReason::Killed), Runner::Daemon), 137);
        assert_eq!(code(&Outcome::Stopped(StopReason::Killed), Runner::Direct), 139);
        assert_eq!(
            exit_info(&Outcome::Stopped(StopReason::Timeout), Runner::Daemon).reason,
            StopReason::Timeout.to_string()
        );
    }
}
