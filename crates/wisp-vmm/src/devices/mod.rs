//! The device seam: a device is one file behind the small [`Device`] trait
//! (the weight of Solo5's `hvt_module_ops`), and a VM's [`Devices`] table
//! is what the load path and the vCPU loop talk to. A device
//! - describes itself in the boot-info device table (kind, parameters),
//! - takes a region of guest RAM at the top of RAM for its rings,
//! - starts serving once the image is loaded (`activate`),
//! - is kicked by the guest's notify hypercall,
//! - knows what happens to it in a forked child,
//! - saves and restores its state (snapshots, migration).
//!
//! Adding a device: a new file here with a `Device` implementation, its
//! kind in `wisp_abi::DeviceKind`, and the toolstack constructing it.

pub mod block;
pub mod data;
pub mod library;
pub mod net;

use std::sync::Arc;

use wisp_abi::layout::{align_up, PAGE_SIZE};
use wisp_abi::libpolicy::LibPolicy;
use wisp_abi::manifest::ImageNote;

use crate::library::restrict::Loader;
use wisp_abi::{BootInfo, DeviceDesc, DeviceKind};

use crate::access::UserMap;
use crate::control::Control;
use crate::error::{Error, Result};
use crate::memory::RamView;

/// A device of a VM.
pub trait Device: Send {
    /// Its kind, as the boot-info table and manifests name it.
    fn kind(&self) -> DeviceKind;
    /// Bytes of guest RAM its shared region takes (0: none).
    fn region_size(&self) -> u64;
    /// The kind-specific words of its boot-info entry.
    fn params(&self) -> [u64; 5];
    /// Start serving the guest: its region is at `base` in `ram`; events
    /// for the guest go through `control`; `user` is what the guest itself
    /// may read and write (for a device that moves data into or out of
    /// buffers the guest names).
    fn activate(&mut self, ram: RamView, base: u64, control: Arc<Control>, user: &UserMap) -> std::io::Result<()>;
    /// The guest kicked it (the notify hypercall, or its doorbell as an exit).
    fn notify(&self);
    /// The eventfd a kick signals, once active, for KVM to signal directly
    /// when the guest rings the device's doorbell (none: kicks go through
    /// [`Device::notify`]).
    fn kick_eventfd(&self) -> Option<&vmm_sys_util::eventfd::EventFd> {
        None
    }
    /// The vCPU thread is about to park (idle, no relatives): a descriptor
    /// whose readability means work for the guest (a NIC's tap), for the
    /// park to wake on directly — the device's own thread may stop watching
    /// it until [`Device::park_ended`]; none when watching it would only
    /// spin.
    fn park_begins(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
    /// The vCPU is about to park (the idle hypercall), before it looks at
    /// its events: send what the guest left for the park (a NIC's queued
    /// frames, `device_flags::PARK_SENDS`).
    fn before_park(&self) {}
    /// Further `wisp_abi::bootinfo::device_flags` of its entry.
    fn flags(&self) -> u32 {
        0
    }
    /// The park that [`Device::park_begins`] announced ended after
    /// `parked`, `woken` by its bell or a descriptor (else by its
    /// deadline): serve the device on this thread if that brings the guest
    /// its work sooner than the device's own thread would.
    fn park_ended(&self, _woken: bool, _parked: std::time::Duration) {}
    /// The vCPU thread is about to park without watching the descriptors
    /// of [`Device::park_begins`] (a VM with relatives parks on its
    /// family's bell): a device whose own thread left them to the vCPU's
    /// parks must watch them again, or their work waits for the guest's
    /// next kick.
    fn park_unwatched(&self) {}
    /// In a forked child process: let go of what stays with the parent.
    /// Later kicks from the child are ignored. A device keeps no
    /// descriptor afterwards: the child's monitor closes every descriptor
    /// its VM does not own (`Vm::keep_in_children`).
    fn on_fork_child(&mut self);
    /// Take over saved parameters (a restored or migrated VM keeps its
    /// identity, e.g. a NIC its MAC and addresses).
    fn restore_state(&mut self, state: &DeviceState) -> Result<()>;
    /// A shared library (mapped in the library window, not in RAM).
    fn as_library(&mut self) -> Option<&mut library::LibraryDevice> {
        None
    }
    /// Run `f` while the device touches no guest RAM (a snapshot copying
    /// it): its own threads wait meanwhile. A device with no thread of its
    /// own just runs it; one that cannot be held says so.
    fn quiesced(&self, f: &mut dyn FnMut()) -> Result<()> {
        f();
        Ok(())
    }
}

/// A device as saved: its boot-info entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceState {
    /// Its kind.
    pub kind: u32,
    /// Guest-physical base of its region.
    pub base: u64,
    /// Size of its region.
    pub size: u64,
    /// Kind-specific parameters.
    pub params: [u64; 5],
}

/// A VM's devices, in boot-info table order.
#[derive(Default)]
pub struct Devices {
    list: Vec<(Box<dyn Device>, u64)>,
    /// The library window, if the VM maps libraries (live updates).
    window: Option<Arc<library::update::Window>>,
    /// The image's manifest and library policy, once checked.
    image: Option<(ImageNote, Option<LibPolicy>)>,
}

impl Devices {
    /// A table of `devices` (not yet placed).
    pub fn new(devices: Vec<Box<dyn Device>>) -> Result<Devices> {
        if devices.len() > wisp_abi::bootinfo::MAX_DEVICES {
            return Err(Error::Devices(format!(
                "{} devices given, at most {} fit the boot-info table",
                devices.len(),
                wisp_abi::bootinfo::MAX_DEVICES
            )));
        }
        Ok(Devices { list: devices.into_iter().map(|d| (d, 0)).collect(), window: None, image: None })
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// The library device at `index` of the table, if it is one.
    pub(crate) fn library_at(&mut self, index: usize) -> Option<&mut library::LibraryDevice> {
        self.list.get_mut(index).and_then(|(d, _)| d.as_library())
    }

    /// Every library's writable bytes, by table index (`vm/reuse.rs`).
    pub(crate) fn library_data(&mut self) -> Vec<(usize, Vec<(usize, Vec<u8>)>)> {
        (0..self.len()).filter_map(|i| self.library_at(i).map(|l| (i, l.data()))).collect()
    }

    /// Put back what [`Devices::library_data`] returned.
    pub(crate) fn put_library_data(&mut self, data: &[(usize, Vec<(usize, Vec<u8>)>)]) {
        for (i, d) in data {
            if let Some(l) = self.library_at(*i) {
                l.put_data(d);
            }
        }
    }

    /// The boot-info entry of device `index`.
    pub(crate) fn entry(&self, index: usize) -> Option<DeviceDesc> {
        let (d, base) = self.list.get(index)?;
        let flags = wisp_abi::bootinfo::device_flags::DOORBELL | d.flags();
        Some(DeviceDesc { kind: d.kind() as u32, flags, base: *base, size: d.region_size(), params: d.params() })
    }

    /// The library window, if the VM maps libraries.
    pub(crate) fn window(&self) -> Option<&Arc<library::update::Window>> {
        self.window.as_ref()
    }

    /// True if there is no device.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Bytes of RAM all device regions take together.
    pub fn ram_taken(&self) -> u64 {
        self.list.iter().map(|(d, _)| align_up(d.region_size(), PAGE_SIZE)).sum()
    }

    /// Place the regions below `ram_end`, top down. Returns where the
    /// guest's own RAM ends.
    pub(crate) fn place(&mut self, ram_end: u64) -> u64 {
        let mut top = ram_end;
        let mut libraries = 0;
        for (d, base) in &mut self.list {
            if let Some(l) = d.as_library() {
                l.place(libraries);
                libraries += 1;
            }
            top -= align_up(d.region_size(), PAGE_SIZE);
            *base = top;
        }
        top
    }

    /// Refuse an image whose manifest needs a device kind this monitor
    /// does not know, or a required device the run does not attach
    /// (matched by kind, in order; a library by its name), and a library
    /// the image's policy does not take from the VM's creator
    /// (`library::restrict`): all before anything is mapped. The window
    /// keeps the manifest and the policy for live updates.
    pub(crate) fn check_manifest(&mut self, note: &ImageNote, policy: Option<&LibPolicy>) -> Result<()> {
        let mut offered: Vec<(DeviceKind, Option<String>)> = self.list.iter_mut().map(|(d, _)| (d.kind(), d.as_library().map(|l| l.name().to_string()))).collect();
        for need in note.devices() {
            let Some(kind) = DeviceKind::from_u32(need.kind).filter(|k| *k != DeviceKind::None) else {
                if need.required() {
                    return Err(Error::Unsupported(format!(
                        "the image needs device '{}' of kind {}, which this monitor does not know",
                        need.name(),
                        need.kind
                    )));
                }
                continue;
            };
            let library = kind == DeviceKind::Library;
            match offered.iter().position(|(k, name)| *k == kind && (!library || name.as_deref() == Some(need.name()))) {
                Some(i) => {
                    offered.remove(i);
                }
                None if need.required() && library => {
                    return Err(Error::Unsupported(format!("the image needs library '{0}', and none was given (run it with --lib {0}.so)", need.name())))
                }
                None if need.required() => {
                    return Err(Error::Unsupported(format!(
                        "the image needs a {} device ('{}'), and none was given{}",
                        kind.name(),
                        need.name(),
                        if kind == DeviceKind::Net { " (run it with --net, or --tap and --ip)" } else { "" }
                    )))
                }
                None => {}
            }
        }
        for (d, _) in &mut self.list {
            if let Some(l) = d.as_library() {
                l.allowed(note, policy, Loader::Create)?;
            }
        }
        self.image = Some((*note, policy.copied()));
        Ok(())
    }

    /// Write the device table of the boot-info page.
    pub(crate) fn describe(&self, info: &mut BootInfo) {
        // Every device has a doorbell: served inside KVM when `activate`
        // could bind its eventfd there, else as an exit (`notify`).
        for i in 0..self.list.len() {
            info.devices[i] = self.entry(i).expect("in the table");
        }
        info.device_count = self.list.len() as u32;
    }

    /// Start every device, and bind each one's kick eventfd to its doorbell
    /// port inside KVM (`KVM_IOEVENTFD`): a doorbell then wakes the device
    /// with no exit. Where KVM cannot, the doorbell exits and is served by
    /// [`Devices::notify`] — slower, the same for the guest.
    pub(crate) fn activate(&mut self, ram: &crate::memory::GuestRam, control: &Arc<Control>, vm: &kvm_ioctls::VmFd, user: &UserMap) -> Result<()> {
        let mut libraries = false;
        for (d, _) in self.list.iter_mut() {
            if let Some(l) = d.as_library() {
                l.map(std::os::fd::AsRawFd::as_raw_fd(vm), ram)?;
                libraries = true;
            }
        }
        if libraries {
            let (manifest, policy) = self.image.unwrap_or_default();
            let w = Arc::new(library::update::Window::new(vm, ram.view(), self, manifest, policy)?);
            self.window = Some(w);
        }
        for (i, (d, base)) in self.list.iter_mut().enumerate() {
            d.activate(ram.view(), *base, control.clone(), user).map_err(|e| Error::Host("start a device", e))?;
            if let Some(fd) = d.kick_eventfd() {
                let port = wisp_abi::DOORBELL_PORT_BASE + i as u16;
                let _ = vm.register_ioevent(fd, &kvm_ioctls::IoEventAddress::Pio(port as u64), kvm_ioctls::NoDatamatch);
            }
        }
        Ok(())
    }

    /// A park begins: the devices' wake sources (see
    /// [`Device::park_begins`]).
    pub(crate) fn park_begins(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        self.list.iter().filter_map(|(d, _)| d.park_begins()).collect()
    }

    /// The vCPU is about to park (see [`Device::before_park`]).
    pub(crate) fn before_park(&self) {
        for (d, _) in &self.list {
            d.before_park();
        }
    }

    /// The park ended (see [`Device::park_ended`]).
    pub(crate) fn park_ended(&self, woken: bool, parked: std::time::Duration) {
        for (d, _) in &self.list {
            d.park_ended(woken, parked);
        }
    }

    /// The vCPU parks without watching them (see [`Device::park_unwatched`]).
    pub(crate) fn park_unwatched(&self) {
        for (d, _) in &self.list {
            d.park_unwatched();
        }
    }

    /// Kick device `index`; false if there is none.
    pub(crate) fn notify(&self, index: u32) -> bool {
        match self.list.get(index as usize) {
            Some((d, _)) => {
                d.notify();
                true
            }
            None => false,
        }
    }

    /// In a forked child process: its libraries' memory (inherited from
    /// the parent's process) given to the child's KVM VM `vm`.
    pub(crate) fn map_libraries_in(&mut self, vm: &kvm_ioctls::VmFd) -> Result<()> {
        for (d, _) in &mut self.list {
            if let Some(l) = d.as_library() {
                l.map_in(std::os::fd::AsRawFd::as_raw_fd(vm))?;
            }
        }
        Ok(())
    }

    /// In a forked child process.
    pub(crate) fn on_fork_child(&mut self) {
        if let Some(w) = &self.window {
            w.forked();
        }
        for (d, _) in &mut self.list {
            d.on_fork_child();
        }
    }

    /// The devices' saved state, in table order.
    pub fn save_state(&self) -> Vec<DeviceState> {
        self.list
            .iter()
            .map(|(d, base)| DeviceState { kind: d.kind() as u32, base: *base, size: d.region_size(), params: d.params() })
            .collect()
    }

    /// Run `f` while no device touches guest RAM (every one held at once).
    pub fn quiesced(&self, f: &mut dyn FnMut()) -> Result<()> {
        fn nest(list: &[(Box<dyn Device>, u64)], f: &mut dyn FnMut()) -> Result<()> {
            match list.split_first() {
                None => {
                    f();
                    Ok(())
                }
                Some(((d, _), rest)) => {
                    let mut inner = Ok(());
                    d.quiesced(&mut || inner = nest(rest, f))?;
                    inner
                }
            }
        }
        nest(&self.list, f)
    }

    /// Give each device, placed ([`Devices::place`]), its saved state: same
    /// kinds, same order, its region where it was (saved states are
    /// untrusted: a region elsewhere is refused).
    pub fn restore_state(&mut self, states: &[DeviceState]) -> Result<()> {
        if states.len() != self.list.len() {
            return Err(Error::Devices(format!("{} devices saved, {} attached", states.len(), self.list.len())));
        }
        for ((d, base), st) in self.list.iter_mut().zip(states) {
            if st.kind != d.kind() as u32 || st.size != d.region_size() {
                return Err(Error::Devices(format!("saved device of kind {} does not match a {} device", st.kind, d.kind().name())));
            }
            if st.base != *base {
                return Err(Error::Devices(format!("saved {} device region at {:#x}, placed at {:#x}", d.kind().name(), st.base, base)));
            }
            d.restore_state(st)?;
        }
        Ok(())
    }
}
