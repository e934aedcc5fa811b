//! The boot path both ways of running a VM share: *prepare* a shell, then
//! *execute*: load an image into it with its arguments and NIC, and set its
//! family's rules. The daemon's VMM process prepares before a request (and
//! warms the shell up); `wisp run` without a daemon does both at once.

use std::os::fd::{AsFd, OwnedFd};

use wisp_vmm::{open_kvm, BlockConfig, DataDevice, Device, Disk, FamilyOptions, Image, NetConfig, Nic, Shell, Vm};

/// What a VM is booted with.
pub struct Boot<'a> {
    /// The image (already parsed and validated).
    pub image: &'a Image,
    /// Its arguments (argument 0, the image name, is added).
    pub args: &'a [String],
    /// Its NIC, if any.
    pub net: Option<NetConfig>,
    /// Its environment and files, if any.
    pub data: Option<DataDevice>,
    /// Its disks, in order.
    pub disks: Vec<BlockConfig>,
    /// How its family behaves ([`daemon_family`] or [`direct_family`]).
    pub family: FamilyOptions,
}

/// Prepare: open KVM and create a shell with `mem` bytes of guest RAM.
pub fn prepare(mem: u64) -> wisp_vmm::Result<Shell> {
    let kvm = open_kvm()?;
    Shell::create(&kvm, mem)
}

/// Execute: load the image into the prepared `shell`; the VM is ready to run.
pub fn load(shell: Shell, boot: Boot<'_>) -> wisp_vmm::Result<Vm> {
    let mut devices: Vec<Box<dyn Device>> = boot.net.into_iter().map(|c| Box::new(Nic::new(c)) as Box<dyn Device>).collect();
    devices.extend(boot.data.map(|d| Box::new(d) as Box<dyn Device>));
    devices.extend(boot.disks.into_iter().map(|c| Box::new(Disk::new(c)) as Box<dyn Device>));
    let mut vm = shell.load_devices(boot.image, boot.args, devices)?;
    vm.set_family_options(boot.family);
    Ok(vm)
}

/// Restore the snapshot chain in `chain` (sealed memfds from the daemon,
/// oldest first: a full snapshot and the incremental ones over it; read
/// and checked again here: the daemon is not trusted blindly) into the
/// prepared `shell`, with `devices` (the snapshot's: same kinds, same
/// order); the VM is ready to run on from where it was saved.
pub fn restore(shell: Shell, chain: &[OwnedFd], devices: Vec<Box<dyn Device>>, family: FamilyOptions) -> wisp_vmm::Result<Vm> {
    restore_held(shell, chain, devices, family, None)
}

/// [`restore`], held with `more` before the VM is made: once the chain's
/// pages are mapped, `more` is asked for one more increment (made over the
/// chain's last snapshot; a migration's destination waits for it there,
/// while the source takes it), which is laid over them.
pub fn restore_held(shell: Shell, chain: &[OwnedFd], devices: Vec<Box<dyn Device>>, family: FamilyOptions, more: Option<Box<dyn FnOnce() -> Result<OwnedFd, String> + '_>>) -> wisp_vmm::Result<Vm> {
    let snaps = chain.iter().map(read_head).collect::<wisp_vmm::Result<Vec<_>>>()?;
    let pairs: Vec<_> = snaps.iter().zip(chain).map(|(s, fd)| (s, fd.as_fd())).collect();
    let mut restoring = shell.begin_restore(&pairs, devices)?;
    if let Some(more) = more {
        let fd = more().map_err(|e| wisp_vmm::Error::Host("the last increment", std::io::Error::other(e)))?;
        restoring.over(&read_head(&fd)?, fd.as_fd())?;
    }
    let mut vm = restoring.finish()?;
    vm.set_family_options(family);
    Ok(vm)
}

/// A snapshot's head from the daemon's sealed memfd `fd` (the daemon
/// checked the digest; the head is parsed again, cheaply).
fn read_head(fd: &OwnedFd) -> wisp_vmm::Result<wisp_vmm::snapshot::Snapshot> {
    let file = std::fs::File::from(fd.try_clone().map_err(|e| wisp_vmm::Error::Host("the snapshot's descriptor", e))?);
    Ok(wisp_vmm::snapshot::Snapshot::read(&file, false)?)
}

/// The environment and files the daemon sent in memfd `fd` (at most
/// 16 MiB: it lets through 512 KiB of files and 64 KiB of environment),
/// checked again here.
pub fn data_from_fd(fd: std::os::fd::OwnedFd) -> Result<DataDevice, String> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::from(fd);
    let len = f.metadata().map_err(|e| format!("environment and files: {e}"))?.len();
    if len > 16 << 20 {
        return Err(format!("environment and files: {len} bytes is too many"));
    }
    let mut bytes = vec![0u8; len as usize];
    f.read_exact_at(&mut bytes, 0).map_err(|e| format!("environment and files: {e}"))?;
    DataDevice::from_region(&bytes).map_err(|e| e.to_string())
}

/// A family under the daemon: the guest may fork if the daemon gave it an
/// uplink (forked VMs become VMs of the toolstack through it), at most
/// `limit` VMs (default: the most a family can hold); children outlive
/// their parent, the daemon manages them.
pub fn daemon_family(uplink: bool, limit: Option<u32>) -> FamilyOptions {
    let max = wisp_abi::family::limits::MAX_MEMBERS as u32;
    FamilyOptions { fork: uplink, limit: limit.unwrap_or(max).clamp(1, max), orphans_die: false, spares: true, recycle: false }
}

/// A family without a daemon: it lives in this process tree (forked VMs are
/// child processes of this one and end when their parent does), at most
/// `limit` VMs.
pub fn direct_family(limit: u32) -> FamilyOptions {
    FamilyOptions { fork: true, limit, orphans_die: true, spares: true, recycle: true }
}
