//! The boot path both ways of running a VM share: *prepare* a shell, then
//! *execute*: load an image into it with its arguments and NIC, and set its
//! family's rules. The daemon's VMM process prepares before a request (and
//! warms the shell up); `wisp run` without a daemon does both at once.

use std::os::fd::{AsFd, OwnedFd};

use wisp_abi::DeviceKind;
use wisp_vmm::{open_kvm, BlockConfig, DataDevice, Device, DeviceState, Disk, FamilyOptions, Image, NetConfig, Nic, Shell, Vm};

/// What a VM is booted with.
pub struct Boot<'a> {
    /// The image (already parsed and validated).
    pub image: &'a Image,
    /// Its arguments (argument 0, the image name, is added).
    pub args: &'a [String],
    /// Its NICs, in order (device-table order: the first is the one the
    /// library OS's network stack takes).
    pub net: Vec<NetConfig>,
    /// Its environment and files, if any.
    pub data: Option<DataDevice>,
    /// Its disks, in order.
    pub disks: Vec<BlockConfig>,
    /// Shared libraries mapped for it (`docs/libraries.md`).
    pub libraries: Vec<wisp_vmm::devices::library::LibraryDevice>,
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
    devices.extend(boot.libraries.into_iter().map(|l| Box::new(l) as Box<dyn Device>));
    let mut vm = shell.load_devices(boot.image, boot.args, devices)?;
    vm.set_family_options(boot.family);
    Ok(vm)
}

/// Restore the snapshot chain in `chain` (sealed memfds from the daemon,
/// oldest first: a full snapshot and the incremental ones over it; read
/// and checked again here: the daemon is not trusted blindly) into the
/// prepared `shell`, with the devices the snapshot had ([`saved_devices`]:
/// its NIC on `net`, its disks on `disks`); the VM is ready to run on from
/// where it was saved. With `more`, the restore is held before the VM is
/// made: once the chain's pages are mapped, `more` is asked for one more
/// increment (made over the chain's last snapshot; a migration's
/// destination waits for it there, while the source takes it), which is
/// laid over them.
pub fn restore_held(
    shell: Shell,
    chain: &[OwnedFd],
    net: Vec<NetConfig>,
    disks: Vec<BlockConfig>,
    family: FamilyOptions,
    more: Option<Box<dyn FnOnce() -> Result<OwnedFd, String> + '_>>,
) -> wisp_vmm::Result<Vm> {
    let snaps = chain.iter().map(read_head).collect::<wisp_vmm::Result<Vec<_>>>()?;
    let last = snaps.last().ok_or_else(|| wisp_vmm::Error::Devices("no snapshot to restore".into()))?;
    let devices = saved_devices(&last.devices, net, disks)?;
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

/// The devices of a restored VM, in the snapshot's order: its NICs on `net`, in order,
/// environment and files already in the saved pages, and a disk for each
/// saved one from `disks`, in order (the contents of a disk are not in a
/// snapshot: the restore is given its volume). What the snapshot had and
/// what the restore was given must match, one for one.
pub fn saved_devices(saved: &[DeviceState], net: Vec<NetConfig>, disks: Vec<BlockConfig>) -> wisp_vmm::Result<Vec<Box<dyn Device>>> {
    let err = |m: String| wisp_vmm::Error::Devices(m);
    let (mut net, mut disks) = (net.into_iter(), disks.into_iter());
    let mut out: Vec<Box<dyn Device>> = Vec::with_capacity(saved.len());
    for (i, d) in saved.iter().enumerate() {
        out.push(match DeviceKind::from_u32(d.kind) {
            Some(DeviceKind::Net) => Box::new(Nic::new(net.next().ok_or_else(|| err(format!("the saved VM had a NIC (device {i}): its restore needs one")))?)),
            Some(DeviceKind::Data) if d.size > 0 && d.size <= wisp_abi::layout::MAX_MEM => Box::new(DataDevice::restored(d.size)),
            Some(DeviceKind::Block) => Box::new(Disk::new(disks.next().ok_or_else(|| err(format!("the saved VM had a disk (device {i}): its restore needs its volume (--volume)")))?)),
            _ => return Err(err(format!("saved device {i} is of kind {} with a {}-byte region: not one a VM here can have", d.kind, d.size))),
        });
    }
    if net.next().is_some() {
        return Err(err("the restore was given more NICs than the saved VM had".into()));
    }
    if disks.next().is_some() {
        return Err(err("the restore was given more volumes than the saved VM had disks".into()));
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(kind: DeviceKind, size: u64) -> DeviceState {
        DeviceState { kind: kind as u32, base: 0, size, params: [0; 5] }
    }

    fn volume() -> BlockConfig {
        let f = tempfile_in_tmp();
        f.set_len(64 << 10).unwrap();
        BlockConfig::from_file(f, false, "test").unwrap()
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let p = std::env::temp_dir().join(format!("wisp-boot-test-{}-{:?}", std::process::id(), std::thread::current().id()));
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        f
    }

    fn refused(saved: &[DeviceState], disks: Vec<BlockConfig>) -> String {
        match saved_devices(saved, Vec::new(), disks) {
            Ok(_) => panic!("restored with {saved:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_restore_gets_the_devices_its_snapshot_lists() {
        let ok = saved_devices(&[dev(DeviceKind::Data, 8192), dev(DeviceKind::Block, 0)], Vec::new(), vec![volume()]).unwrap();
        assert_eq!(ok.iter().map(|d| d.kind()).collect::<Vec<_>>(), [DeviceKind::Data, DeviceKind::Block]);
        assert_eq!(ok[0].region_size(), 8192, "the saved region's size");
        assert!(refused(&[dev(DeviceKind::Net, 0)], vec![]).contains("its restore needs one"));
        assert!(refused(&[dev(DeviceKind::Block, 0)], vec![]).contains("needs its volume"));
        assert!(refused(&[], vec![volume()]).contains("more volumes"));
        assert!(refused(&[dev(DeviceKind::Data, 0)], vec![]).contains("not one a VM here can have"));
        assert!(refused(&[dev(DeviceKind::Data, u64::MAX)], vec![]).contains("not one a VM here can have"));
        assert!(refused(&[DeviceState { kind: 77, base: 0, size: 4096, params: [0; 5] }], vec![]).contains("kind 77"));
    }
}
