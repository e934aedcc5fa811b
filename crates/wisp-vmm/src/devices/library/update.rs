//! Live update of a library in a running VM (issue 17; KylinX §3.3;
//! `docs/libraries.md` "Live update"). Two threads take part:
//!
//! - the thread that serves the toolstack ([`Window::update`]) checks the
//!   new library against the one it replaces (`library::update::Plan`:
//!   refused before anything changes), maps it in a free slot while the
//!   guest runs, sets bit 0 of the boot-info page's `lib_state` and posts
//!   the `LIBRARY` event (which wakes a guest that idles);
//! - the guest, at its next point where no frame of a library's code is on
//!   its stack (the library OS checks at its scheduling points and before
//!   each outermost library call), makes the `library` hypercall: the vCPU
//!   thread ([`Window::switch`]) copies the old library's variables into
//!   the new one's, puts the new library in the old one's boot-info entry
//!   (same name), bumps the generation and returns — the guest's pause;
//! - back on the first thread, the answer goes out; the old library is
//!   unmapped when the guest next idles, or before the next update
//!   ([`Window::reap`]).
//!
//! A guest that reaches no such point in time leaves the update undone:
//! the new library is unmapped again and the VM runs the old one.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use wisp_abi::layout::BOOT_INFO;
use wisp_abi::libpolicy::LibPolicy;
use wisp_abi::{BootInfo, DeviceDesc, ImageNote};

use super::{LibraryDevice, MAX_LIBRARIES};
use crate::control::Control;
use crate::devices::Devices;
use crate::error::{Error, Result};
use crate::library::restrict::Loader;
use crate::library::update::{Carried, Plan};
use crate::memory::RamView;

/// A VM's library window, shared by its vCPU thread and the thread that
/// serves the toolstack.
pub struct Window {
    /// A duplicate of the VM's KVM descriptor (for memory slots).
    vm: OwnedFd,
    ram: RamView,
    state: Mutex<State>,
    cv: Condvar,
    /// `State::retired` holds libraries (read without the lock at each park).
    retired: AtomicBool,
    /// The image's manifest and library policy: what an update must meet.
    manifest: ImageNote,
    policy: Option<LibPolicy>,
}

/// A library mapped, as the window knows it.
struct Entry {
    /// Its index in the boot-info device table.
    index: usize,
    name: String,
    lib: crate::library::Library,
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    used: [bool; MAX_LIBRARIES],
    /// An update is under way (one at a time).
    busy: bool,
    /// The new library, mapped, waiting for the guest.
    job: Option<Job>,
    /// What the switch gave back.
    done: Option<Switched>,
    generation: u32,
    /// In a forked child: its KVM VM is not the one mapped.
    forked: bool,
    /// Libraries switched out, to unmap off the request's path
    /// ([`Window::reap`]).
    retired: Vec<LibraryDevice>,
}

struct Job {
    entry: usize,
    device: LibraryDevice,
    plan: Plan,
}

struct Switched {
    old: LibraryDevice,
    carried: Carried,
    held: Duration,
}

/// What an update did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Updated {
    /// Microseconds from the request to the guest switched (the old
    /// library is unmapped later: [`Window::reap`]).
    pub total_us: u64,
    /// Microseconds the guest waited in its `library` hypercall (the
    /// switch, as the monitor timed it).
    pub held_us: u64,
    /// Microseconds from the new library mapped to the guest's switch.
    pub quiesce_us: u64,
    /// Variables carried over, and pointers moved with them.
    pub variables: usize,
    pub pointers: usize,
    /// Pointers into the old library left as they were (not to an export).
    pub stale: usize,
}

impl Window {
    /// The window of a VM (KVM descriptor `vm`, RAM `ram`) whose libraries
    /// `devices` maps.
    pub(crate) fn new(vm: &kvm_ioctls::VmFd, ram: RamView, devices: &mut Devices, manifest: ImageNote, policy: Option<LibPolicy>) -> Result<Window> {
        let vm = rustix::io::fcntl_dupfd_cloexec(unsafe_borrow(vm), 0).map_err(|e| Error::Host("keep the VM's descriptor", e.into()))?;
        let mut st = State::default();
        for index in 0..devices.len() {
            if let Some(d) = devices.library_at(index) {
                st.used[d.slot.unwrap_or(0)] = true;
                st.entries.push(Entry { index, name: d.name.clone(), lib: d.lib.clone() });
            }
        }
        Ok(Window { vm, ram, state: Mutex::new(st), cv: Condvar::new(), retired: AtomicBool::new(false), manifest, policy })
    }

    /// In a forked child: updates are refused (the child's KVM VM is
    /// another; its descriptor here is the parent's, closed).
    pub(crate) fn forked(&self) {
        self.state.lock().unwrap().forked = true;
    }

    fn write_state(&self, st: &State) {
        let pending = u32::from(st.job.is_some());
        let _ = self.ram.write(BOOT_INFO + std::mem::offset_of!(BootInfo, lib_state) as u64, &(st.generation << 1 | pending).to_le_bytes());
    }

    /// Replace the library named `name` by `new` (checked), as the module
    /// says, waiting at most `wait` for the guest. The VM runs the old
    /// library if this fails.
    pub fn update(&self, control: &Control, name: &str, mut new: LibraryDevice, wait: Duration) -> Result<Updated> {
        let t0 = Instant::now();
        new.name = name.to_string();
        new.allowed(&self.manifest, self.policy.as_ref(), Loader::Update)?;
        self.reap();
        let (entry, plan, slot) = {
            let mut st = self.state.lock().unwrap();
            if st.forked {
                return Err(Error::Devices("a forked child's libraries cannot be updated".into()));
            }
            if st.busy {
                return Err(Error::Devices("another update of this VM's libraries is under way".into()));
            }
            let Some(entry) = st.entries.iter().position(|e| e.name == name) else {
                let names: Vec<&str> = st.entries.iter().map(|e| e.name.as_str()).collect();
                return Err(Error::Devices(format!("the VM maps no library named {name} (it maps: {})", names.join(", "))));
            };
            let plan = Plan::new(&st.entries[entry].lib, &new.lib)?;
            let Some(slot) = st.used.iter().position(|u| !u) else {
                return Err(Error::Devices(format!("no free slot in the library window (at most {MAX_LIBRARIES} libraries)")));
            };
            st.used[slot] = true;
            st.busy = true;
            (entry, plan, slot)
        };
        // Mapped while the guest runs: a slot it does not use yet.
        new.place(slot);
        if let Err(e) = new.map(self.vm.as_raw_fd(), &self.ram) {
            let mut st = self.state.lock().unwrap();
            st.used[slot] = false;
            st.busy = false;
            return Err(e);
        }
        let mapped = Instant::now();
        {
            let mut st = self.state.lock().unwrap();
            st.job = Some(Job { entry, device: new, plan });
            self.write_state(&st);
        }
        control.post_events(wisp_abi::events::LIBRARY);
        let deadline = mapped + wait;
        let mut st = self.state.lock().unwrap();
        let switched = loop {
            if let Some(s) = st.done.take() {
                break s;
            }
            let now = Instant::now();
            if now >= deadline {
                if let Some(job) = st.job.take() {
                    // The guest did not come: it keeps the old library.
                    self.write_state(&st);
                    st.used[slot] = false;
                    st.busy = false;
                    drop(st);
                    if let Some(m) = job.device.mapping {
                        m.unmap(self.vm.as_raw_fd(), &self.ram);
                    }
                    return Err(Error::Devices(format!(
                        "the guest reached no point where library {name} is unused within {} ms (it makes no library call and does not idle, or a call of it waits): it runs the old library",
                        wait.as_millis()
                    )));
                }
            }
            // A switch taken is a switch that ends at once.
            st = self.cv.wait_timeout(st, deadline.saturating_duration_since(now).max(Duration::from_millis(1))).unwrap().0;
        };
        let quiesce = mapped.elapsed();
        // The old library is unmapped by `reap`, off the request's path.
        st.retired.push(switched.old);
        self.retired.store(true, Ordering::Release);
        drop(st);
        let c = switched.carried;
        Ok(Updated {
            total_us: t0.elapsed().as_micros() as u64,
            held_us: switched.held.as_micros() as u64,
            quiesce_us: quiesce.as_micros() as u64,
            variables: c.variables,
            pointers: c.pointers,
            stale: c.stale,
        })
    }

    /// Unmap the libraries an update switched out (its last step, off the
    /// request's path); the update is over then. Deleting a KVM memory
    /// slot stalls a vCPU that runs the guest meanwhile (on this host by
    /// about as much as the switch itself): so it is done where the vCPU
    /// is out of the guest anyway — by the vCPU thread as it parks
    /// ([`Window::reap_at_park`]) — or, for a guest that never idles,
    /// before the next update.
    pub fn reap(&self) {
        if !self.retired.swap(false, Ordering::AcqRel) {
            return;
        }
        let retired = std::mem::take(&mut self.state.lock().unwrap().retired);
        if retired.is_empty() {
            return;
        }
        let slots: Vec<usize> = retired.iter().filter_map(|d| d.slot).collect();
        for d in retired {
            if let Some(m) = d.mapping {
                m.unmap(self.vm.as_raw_fd(), &self.ram);
            }
        }
        let mut st = self.state.lock().unwrap();
        for s in slots {
            st.used[s] = false;
        }
        st.busy = false;
    }

    /// The vCPU thread is about to park (the guest idles): unmap what an
    /// update switched out, if anything.
    pub(crate) fn reap_at_park(&self) {
        if self.retired.load(Ordering::Acquire) {
            self.reap();
        }
    }

    /// The guest's `library` hypercall (on the vCPU thread, the guest at a
    /// point where it runs no library code): switch the update waiting, if
    /// any. Returns the libraries switched.
    pub(crate) fn switch(&self, devices: &mut Devices) -> u32 {
        let t = Instant::now();
        let mut st = self.state.lock().unwrap();
        let Some(mut job) = st.job.take() else {
            return 0;
        };
        let index = st.entries[job.entry].index;
        let Some(old) = devices.library_at(index) else {
            // Not a library there: nothing changes (the update fails).
            st.job = Some(job);
            return 0;
        };
        let (ob, nb) = (old.guest_base(), job.device.guest_base());
        let carried = match (&old.mapping, &mut job.device.mapping) {
            (Some(o), Some(n)) => job.plan.carry(o.bytes(), ob, n.bytes_mut(), nb),
            _ => Carried::default(),
        };
        st.entries[job.entry].lib = job.device.lib.clone();
        let old = std::mem::replace(old, job.device);
        if let Some(desc) = devices.entry(index) {
            let at = BOOT_INFO + std::mem::offset_of!(BootInfo, devices) as u64 + (index * size_of::<DeviceDesc>()) as u64;
            let _ = self.ram.write_obj(at, &desc);
        }
        st.generation = st.generation.wrapping_add(1) & (u32::MAX >> 1);
        self.write_state(&st);
        st.done = Some(Switched { old, carried, held: t.elapsed() });
        self.cv.notify_all();
        1
    }
}

/// The VM's descriptor, borrowed for a `dup`.
fn unsafe_borrow(vm: &kvm_ioctls::VmFd) -> std::os::fd::BorrowedFd<'_> {
    // SAFETY: `vm` owns the descriptor and outlives the borrow.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(vm.as_raw_fd()) }
}
