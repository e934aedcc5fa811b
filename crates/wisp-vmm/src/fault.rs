//! Why a VM stopped, and the decoding of guest exceptions into a reason a
//! person can act on.

use std::fmt;

use wisp_abi::layout::{EXCEPTION_STACK, PAGE_SIZE, STACK_BOTTOM, STACK_GUARD};

use crate::arch::has_error_code;
use crate::memory::GuestRam;

/// How a VM's run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The guest called exit with this code.
    Exited(i32),
    /// The monitor stopped the guest.
    Stopped(StopReason),
}

/// Why the monitor stopped a guest. Never a panic of the monitor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The run's time limit passed.
    Timeout,
    /// Killed through the toolstack.
    Killed,
    /// The guest took a CPU exception.
    Exception(Fault),
    /// The guest touched guest-physical memory that is not RAM.
    OutsideRam { addr: u64, write: bool },
    /// A hypercall with an invalid argument block, pointer or length.
    BadHypercall { call: &'static str, detail: String },
    /// A hypercall number the monitor does not know.
    UnknownHypercall { port: u16 },
    /// Port I/O outside the hypercall protocol.
    BadIo { port: u16, detail: &'static str },
    /// A triple fault (the CPU shut the VM down).
    TripleFault,
    /// KVM reported an error or an exit the monitor does not handle.
    Kvm(String),
}

/// A decoded guest exception.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Exception vector.
    pub vector: u8,
    /// Error code (0 if the exception has none).
    pub error_code: u64,
    /// Guest instruction pointer at the fault.
    pub rip: u64,
    /// Guest stack pointer at the fault.
    pub rsp: u64,
    /// Faulting address (page faults only).
    pub cr2: u64,
    /// What the faulting instruction was, if recognised (e.g. "hlt").
    pub insn: Option<&'static str>,
    /// Bytes of guest RAM (to classify addresses).
    pub mem_size: u64,
}

const NAMES: [&str; 32] = [
    "divide error (#DE)",
    "debug (#DB)",
    "NMI",
    "breakpoint (#BP)",
    "overflow (#OF)",
    "bound range (#BR)",
    "invalid opcode (#UD)",
    "device not available (#NM)",
    "double fault (#DF)",
    "coprocessor segment overrun",
    "invalid TSS (#TS)",
    "segment not present (#NP)",
    "stack-segment fault (#SS)",
    "general protection fault (#GP)",
    "page fault (#PF)",
    "reserved (15)",
    "x87 floating-point error (#MF)",
    "alignment check (#AC)",
    "machine check (#MC)",
    "SIMD floating-point error (#XM)",
    "virtualization exception (#VE)",
    "control protection (#CP)",
    "reserved (22)",
    "reserved (23)",
    "reserved (24)",
    "reserved (25)",
    "reserved (26)",
    "reserved (27)",
    "hypervisor injection (#HV)",
    "VMM communication (#VC)",
    "security exception (#SX)",
    "reserved (31)",
];

impl Fault {
    /// Decode the exception frame the CPU pushed on the monitor-owned
    /// exception stack. `rsp` is the CPL-0 stack pointer after the stub ran.
    pub fn decode(ram: &GuestRam, vector: u8, rsp: u64, cr2: u64) -> Option<Fault> {
        let stack_top = EXCEPTION_STACK + PAGE_SIZE;
        let mut at = rsp;
        let mut next = || -> Option<u64> {
            if at >= stack_top {
                return None;
            }
            let v = ram.read_u64(at).ok()?;
            at += 8;
            Some(v)
        };
        let error_code = if has_error_code(vector) { next()? } else { 0 };
        let rip = next()?;
        let _cs = next()?;
        let _rflags = next()?;
        let user_rsp = next()?;
        let mut insn_bytes = [0u8; 3];
        let insn = if ram.read(rip, &mut insn_bytes).is_ok() { classify_insn(&insn_bytes) } else { None };
        Some(Fault { vector: vector & 31, error_code, rip, rsp: user_rsp, cr2, insn, mem_size: ram.size() })
    }
}

/// Recognise the privileged or I/O instructions a guest may try.
fn classify_insn(b: &[u8; 3]) -> Option<&'static str> {
    let (op, rest) = match b[0] {
        0x66 | 0xf2 | 0xf3 | 0x40..=0x4f => (b[1], b[2]),
        _ => (b[0], b[1]),
    };
    Some(match (op, rest) {
        (0xf4, _) => "hlt",
        (0xfa, _) => "cli",
        (0xfb, _) => "sti",
        (0xcd, _) => "int n",
        (0xe4..=0xe7, _) | (0xec..=0xef, _) | (0x6c..=0x6f, _) => "port I/O outside the hypercall window",
        (0x0f, 0x22) => "mov to control register",
        (0x0f, 0x20) => "mov from control register",
        (0x0f, 0x23) | (0x0f, 0x21) => "mov debug register",
        (0x0f, 0x01) => "system-table instruction (lgdt/lidt/...)",
        (0x0f, 0x00) => "segment-table instruction (lldt/ltr/...)",
        (0x0f, 0x30) => "wrmsr",
        (0x0f, 0x32) => "rdmsr",
        (0x0f, 0x08) | (0x0f, 0x09) => "cache invalidation (invd/wbinvd)",
        (0x0f, 0x0b) => "ud2",
        (0x0f, 0x05) => "syscall",
        _ => return None,
    })
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = NAMES[self.vector as usize];
        match self.vector {
            14 => {
                let what = if self.error_code & 2 != 0 { "write to" } else if self.error_code & 16 != 0 { "execute at" } else { "read from" };
                let a = self.cr2;
                let why = if (STACK_GUARD..STACK_BOTTOM).contains(&a) {
                    "stack overflow: the stack guard page was hit"
                } else if a < PAGE_SIZE {
                    "null pointer dereference"
                } else if a >= self.mem_size {
                    "address outside guest RAM"
                } else if self.error_code & 1 != 0 {
                    "protection violation (read-only, no-execute or monitor-owned page)"
                } else {
                    "address not mapped"
                };
                write!(f, "{name}: {what} {a:#x} at rip {:#x}: {why}", self.rip)
            }
            _ => {
                write!(f, "{name} at rip {:#x}", self.rip)?;
                if let Some(i) = self.insn {
                    write!(f, " ({i})")?;
                    if self.vector == 13 && i != "ud2" && i != "syscall" {
                        write!(f, ": privileged instruction at CPL 3")?;
                    }
                }
                if has_error_code(self.vector) && self.error_code != 0 {
                    write!(f, ", error code {:#x}", self.error_code)?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::Timeout => write!(f, "timeout: the VM ran past its time limit"),
            StopReason::Killed => write!(f, "killed"),
            StopReason::Exception(x) => write!(f, "guest fault: {x}"),
            StopReason::OutsideRam { addr, write } => write!(
                f,
                "guest {} guest-physical {addr:#x}, outside guest RAM",
                if *write { "wrote to" } else { "read from" }
            ),
            StopReason::BadHypercall { call, detail } => write!(f, "bad hypercall {call}: {detail}"),
            StopReason::UnknownHypercall { port } => write!(
                f,
                "unknown hypercall {} (port {port:#x})",
                port.wrapping_sub(wisp_abi::HYPERCALL_PORT_BASE)
            ),
            StopReason::BadIo { port, detail } => write!(f, "bad port I/O on {port:#x}: {detail}"),
            StopReason::TripleFault => write!(f, "triple fault: the guest's CPU shut down"),
            StopReason::Kvm(s) => write!(f, "KVM: {s}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_privileged_instructions() {
        assert_eq!(classify_insn(&[0xf4, 0, 0]), Some("hlt"));
        assert_eq!(classify_insn(&[0xfa, 0, 0]), Some("cli"));
        assert_eq!(classify_insn(&[0x0f, 0x22, 0xd8]), Some("mov to control register"));
        assert_eq!(classify_insn(&[0x0f, 0x0b, 0]), Some("ud2"));
        assert_eq!(classify_insn(&[0x90, 0, 0]), None);
    }

    #[test]
    fn page_fault_reasons() {
        let mk = |cr2, ec| Fault { vector: 14, error_code: ec, rip: 0x100000, rsp: 0, cr2, insn: None, mem_size: 16 << 20 };
        assert!(mk(0x1_8000, 2).to_string().contains("stack overflow"));
        assert!(mk(0x8, 0).to_string().contains("null pointer"));
        assert!(mk(1 << 30, 2).to_string().contains("outside guest RAM"));
        assert!(mk(0x6000, 3).to_string().contains("protection violation"));
    }
}
