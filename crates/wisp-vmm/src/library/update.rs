//! What a live update of a library carries over (issue 17, KylinX §3.3):
//! the plan made before anything changes — every export of the old
//! library must be in the new one, of the same kind, a variable of the
//! same size (else the update is refused) — and the copy of the old
//! library's variables into the new one's, made while the guest waits at
//! its quiescent point.
//!
//! A variable's 8-byte words that point into the old library are moved
//! with it: into an exported variable, to the same place of that variable
//! in the new library; at an exported function, to the new function of
//! that name. A pointer into anything else of the old library (an
//! unexported static, a constant) is left as it is and is counted
//! (`Carried::stale`): it dangles once the old library is unmapped.

use super::{Export, Kind, Library};
use crate::error::LibraryError;

/// A variable to carry over: its offset in the old and the new library,
/// and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Move {
    old: u64,
    new: u64,
    size: u64,
}

/// What an update of `old` by `new` carries over (checked compatible).
#[derive(Clone, Debug)]
pub struct Plan {
    vars: Vec<Move>,
    /// Old exports by address (for pointers into them), each with its new
    /// address: `(old value, old size, kind, new value)`.
    targets: Vec<(u64, u64, Kind, u64)>,
    old_span: u64,
}

/// What a carry-over did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Carried {
    /// Variables copied.
    pub variables: usize,
    /// Bytes copied.
    pub bytes: u64,
    /// Pointers moved to the new library.
    pub pointers: usize,
    /// Pointers into the old library left as they are (not to an export).
    pub stale: usize,
}

/// Whether a variable lies in a writable segment (what a guest may have
/// changed; read-only data is the new library's own).
fn writable(lib: &Library, e: &Export) -> bool {
    lib.segments.iter().any(|s| s.write && e.value >= s.vaddr && e.value + e.size <= s.vaddr + s.mem_size)
}

impl Plan {
    /// The plan for replacing `old` by `new`, or why `new` is not
    /// binary-compatible with it.
    pub fn new(old: &Library, new: &Library) -> Result<Plan, LibraryError> {
        let incompatible = |m: String| Err(LibraryError::Incompatible(m));
        let (mut vars, mut targets) = (Vec::new(), Vec::new());
        for o in &old.exports {
            let Some(n) = new.export(&o.name) else {
                return incompatible(format!("the new library has no {}", o.name));
            };
            if n.kind != o.kind {
                let what = |k| if k == Kind::Function { "a function" } else { "a variable" };
                return incompatible(format!("{} was {} and is {} in the new library", o.name, what(o.kind), what(n.kind)));
            }
            if o.kind == Kind::Variable {
                if n.size != o.size {
                    return incompatible(format!("variable {} was {} bytes and is {} in the new library", o.name, o.size, n.size));
                }
                if writable(old, o) && writable(new, n) {
                    vars.push(Move { old: o.value, new: n.value, size: o.size });
                }
            }
            targets.push((o.value, o.size, o.kind, n.value));
        }
        targets.sort_by_key(|t| t.0);
        Ok(Plan { vars, targets, old_span: old.span })
    }

    /// Variables the plan carries.
    pub fn variables(&self) -> usize {
        self.vars.len()
    }

    /// Where an address of the old library (at `old_base`) goes in the new
    /// one (at `new_base`): `Some(new)` for a pointer into an exported
    /// variable or at an exported function, `None` for anything else.
    fn moved(&self, v: u64, old_base: u64, new_base: u64) -> Option<u64> {
        let off = v - old_base;
        let i = self.targets.partition_point(|t| t.0 <= off).checked_sub(1)?;
        // Exports may overlap (aliases): the nearest one below decides.
        let (value, size, kind, new) = self.targets[i];
        let inside = match kind {
            Kind::Function => off == value,
            Kind::Variable => off < value + size.max(1),
        };
        inside.then(|| new_base + new + (off - value))
    }

    /// Copy the variables of the old library's memory `old` (mapped at
    /// guest address `old_base`) into the new one's `new` (at `new_base`),
    /// moving the pointers they hold. Both are the libraries' whole
    /// mappings (at least their spans: checked, a short one copies
    /// nothing).
    pub fn carry(&self, old: &[u8], old_base: u64, new: &mut [u8], new_base: u64) -> Carried {
        let mut c = Carried::default();
        for m in &self.vars {
            let (o, n, size) = (m.old as usize, m.new as usize, m.size as usize);
            if o.checked_add(size).is_none_or(|e| e > old.len()) || n.checked_add(size).is_none_or(|e| e > new.len()) {
                continue;
            }
            new[n..n + size].copy_from_slice(&old[o..o + size]);
            c.variables += 1;
            c.bytes += m.size;
            // Words at 8-byte-aligned addresses of the variable.
            let mut at = m.old.next_multiple_of(8);
            while at + 8 <= m.old + m.size {
                let v = u64::from_le_bytes(old[at as usize..at as usize + 8].try_into().expect("8 bytes"));
                if v >= old_base && v < old_base + self.old_span {
                    match self.moved(v, old_base, new_base) {
                        Some(w) => {
                            let dst = n + (at - m.old) as usize;
                            new[dst..dst + 8].copy_from_slice(&w.to_le_bytes());
                            c.pointers += 1;
                        }
                        None => c.stale += 1,
                    }
                }
                at += 8;
            }
        }
        c
    }
}
