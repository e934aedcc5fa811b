//! An OCI bundle read into what its VM needs: the image (`/wisp/image` in
//! the root filesystem by convention, or the path the annotation
//! [`IMAGE_ANNOTATION`] names there), the guest's arguments and
//! environment, its RAM (the spec's memory limit) and the network
//! namespace it joins. The spec types are `oci-spec`'s; everything the
//! bundle says is checked here, before a VM is made, and refused with
//! what is wrong.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use oci_spec::runtime::{LinuxNamespaceType, Spec};

/// Names the image's path inside the root filesystem.
pub const IMAGE_ANNOTATION: &str = "org.wisp.image";
/// Where the image is unless the annotation says.
pub const DEFAULT_IMAGE: &str = "/wisp/image";

/// Annotations by which Kubernetes' runtimes mark a pod's sandbox (pause)
/// container: containerd's CRI and CRI-O's.
const SANDBOX_ANNOTATIONS: [(&str, &str); 2] = [("io.kubernetes.cri.container-type", "sandbox"), ("io.kubernetes.cri-o.ContainerType", "sandbox")];

/// Which network namespace the VM's process lives in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Netns {
    /// The runtime's own (the spec asks for none): the VM gets no NIC.
    Host,
    /// One the engine made (podman, Kubernetes): joined, and its
    /// interface handed to the VM.
    Join(PathBuf),
    /// A new, empty one (containerd without networking).
    New,
}

/// What the bundle asks for.
#[derive(Debug)]
pub struct Plan {
    /// The bundle directory, absolute.
    pub bundle: PathBuf,
    /// The image file, opened (its name for messages); none for a pod's
    /// sandbox container (it only holds the pod's namespaces: its process
    /// pauses).
    pub image: Option<(String, std::os::fd::OwnedFd)>,
    /// The guest's arguments (after its name).
    pub args: Vec<String>,
    /// `NAME=VALUE` each.
    pub env: Vec<String>,
    pub netns: Netns,
    /// process.terminal: the engine gave a console socket for a terminal.
    pub terminal: bool,
    pub annotations: HashMap<String, String>,
    /// linux.cgroupsPath, if the engine gave one, and the limits for it.
    pub cgroups_path: Option<PathBuf>,
    pub limits: crate::cgroup::Limits,
}

/// Read and check the bundle at `dir`.
pub fn read(dir: &Path) -> Result<Plan, String> {
    let bundle = std::fs::canonicalize(dir).map_err(|e| format!("bundle {}: {e}", dir.display()))?;
    let config = bundle.join("config.json");
    // Parsed here rather than with `Spec::load`, whose error says only
    // "serde failed": the engine's user is told where and what.
    let bytes = std::fs::read(&config).map_err(|e| format!("{}: {e}", config.display()))?;
    let spec: Spec = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", config.display()))?;
    let root = spec.root().as_ref().ok_or_else(|| format!("{}: no root (the root filesystem holding the image)", config.display()))?;
    let rootfs = bundle.join(root.path());
    let rootfs = std::fs::canonicalize(&rootfs).map_err(|e| format!("root filesystem {}: {e}", rootfs.display()))?;
    let annotations = spec.annotations().clone().unwrap_or_default();
    let inside = annotations.get(IMAGE_ANNOTATION).map(String::as_str).unwrap_or(DEFAULT_IMAGE);
    // A pod's sandbox needs no VM: what it runs (pause) only holds the
    // pod's namespaces until it is stopped, which the runtime's process
    // does itself.
    let sandbox = SANDBOX_ANNOTATIONS.iter().any(|(k, v)| annotations.get(*k).is_some_and(|a| a == v));
    let image = if sandbox { None } else { Some((inside.to_string(), open_image(&rootfs, inside)?)) };
    let process = spec.process().as_ref();
    let mut args = process.and_then(|p| p.args().clone()).unwrap_or_default();
    // args[0] is the program, as for any container: the image (by its path
    // in the root filesystem or its name) is dropped; anything else is the
    // guest's first argument.
    let name = Path::new(inside).file_name().and_then(|n| n.to_str()).unwrap_or("");
    if args.first().is_some_and(|a| a == inside || a == name || Path::new(a) == Path::new(inside)) {
        args.remove(0);
    }
    let env = process.and_then(|p| p.env().clone()).unwrap_or_default();
    // The monitor's own rules (entries, size), checked before any process
    // is made; the container's process encodes it again for its VM.
    wisp_vmm::DataDevice::new(&env, &[]).map_err(|e| format!("process.env: {e}"))?;
    let terminal = process.and_then(|p| p.terminal()).unwrap_or(false);
    let linux = spec.linux().as_ref();
    let resources = linux.and_then(|l| l.resources().as_ref());
    let limit = resources.and_then(|r| r.memory().as_ref()).and_then(|m| m.limit());
    let mem = match limit {
        // -1 (and 0) mean no limit.
        Some(b) if b > 0 => {
            Some(wisp_vmm::check_mem_size(b as u64).map_err(|e| format!("linux.resources.memory.limit {b}: {e}"))?)
        }
        _ => None,
    };
    let cpu = resources.and_then(|r| r.cpu().as_ref());
    let limits = crate::cgroup::Limits {
        cpu_quota: cpu.and_then(|c| c.quota()),
        cpu_period: cpu.and_then(|c| c.period()),
        cpu_shares: cpu.and_then(|c| c.shares()),
        pids: resources.and_then(|r| r.pids().as_ref()).map(|p| p.limit()),
        memory: mem,
    };
    let cgroups_path = linux.and_then(|l| l.cgroups_path().clone());
    let ns = linux.and_then(|l| l.namespaces().as_ref()).and_then(|v| v.iter().find(|n| n.typ() == LinuxNamespaceType::Network));
    let netns = match ns {
        None => Netns::Host,
        Some(n) => match n.path() {
            Some(p) => Netns::Join(p.clone()),
            None => Netns::New,
        },
    };
    Ok(Plan { bundle, image, args, env, netns, terminal, annotations, cgroups_path, limits })
}

/// Open the file at absolute path `inside` of `rootfs`, resolved as if
/// `rootfs` were `/` (`openat2` with `RESOLVE_IN_ROOT`: `..` and symbolic
/// links, absolute ones included, stay in it, as they would in the
/// container; no magic links). The descriptor is what the VM is made from
/// (no second lookup of the path: nothing can be swapped in between).
fn open_image(rootfs: &Path, inside: &str) -> Result<std::os::fd::OwnedFd, String> {
    use rustix::fs::{openat2, Mode, OFlags, ResolveFlags};
    let rel = Path::new(inside);
    if !rel.is_absolute() || rel.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(format!("image path {inside:?} (annotation {IMAGE_ANNOTATION}) must be absolute in the root filesystem, without '..'"));
    }
    let root = std::fs::File::open(rootfs).map_err(|e| format!("root filesystem {}: {e}", rootfs.display()))?;
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
    let fd = openat2(&root, rel.strip_prefix("/").unwrap_or(rel), flags, Mode::empty(), ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS)
        .map_err(|e| match e {
            rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR => format!(
                "no wisp image at {inside} in the root filesystem (put it there, or name it with the annotation {IMAGE_ANNOTATION})"
            ),
            e => format!("image {inside} in the root filesystem: {e}"),
        })?;
    let meta = std::fs::File::from(fd.try_clone().map_err(|e| e.to_string())?).metadata().map_err(|e| format!("image {inside}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("image {inside:?} in the root filesystem is not a regular file"));
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(tag: &str, config: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("wisp-oci-bundle-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("rootfs/wisp")).unwrap();
        std::fs::write(d.join("rootfs/wisp/image"), b"not checked here").unwrap();
        std::fs::write(d.join("config.json"), config).unwrap();
        d
    }

    const BASE: &str = r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"cwd":"/","user":{"uid":0,"gid":0},"args":["/wisp/image","a","b"],"env":["A=1","PATH=/bin"]},
        "linux":{"resources":{"memory":{"limit":33554432}},"namespaces":[{"type":"network","path":"/run/netns/x"},{"type":"pid"}]}}"#;

    #[test]
    fn a_bundle_becomes_a_plan() {
        let d = bundle("ok", BASE);
        let p = read(&d).unwrap();
        assert_eq!(p.image.unwrap().0, "/wisp/image");
        assert_eq!(p.args, ["a", "b"]);
        assert_eq!(p.env, ["A=1", "PATH=/bin"]);
        assert_eq!(p.limits.memory, Some(32 << 20));
        assert_eq!(p.netns, Netns::Join("/run/netns/x".into()));
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn bad_bundles_are_refused_with_what_is_wrong() {
        let cases = [
            ("junk", "{not json", "config.json"),
            ("noroot", r#"{"ociVersion":"1.0.2"}"#, "no root"),
            ("norootfs", r#"{"ociVersion":"1.0.2","root":{"path":"nope"}}"#, "root filesystem"),
            ("noimage", r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"annotations":{"org.wisp.image":"/other"}}"#, "no wisp image at /other"),
            ("dotdot", r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"annotations":{"org.wisp.image":"/../config.json"}}"#, "without '..'"),
            ("dir", r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"annotations":{"org.wisp.image":"/wisp"}}"#, "not a regular file"),
            ("env", r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"cwd":"/","user":{"uid":0,"gid":0},"env":["NOEQ"]}}"#, "'NOEQ' is not KEY=VALUE"),
            ("mem", r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"linux":{"resources":{"memory":{"limit":4096}}}}"#, "memory too small"),
        ];
        for (tag, config, want) in cases {
            let d = bundle(tag, config);
            let e = read(&d).unwrap_err();
            assert!(e.contains(want), "{tag}: {e}");
            let _ = std::fs::remove_dir_all(d);
        }
        // A symbolic link to a host path is looked up in the root
        // filesystem, as in the container: not found there.
        let d = bundle("link", r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"annotations":{"org.wisp.image":"/escape"}}"#);
        std::os::unix::fs::symlink(d.join("config.json"), d.join("rootfs/escape")).unwrap();
        assert!(read(&d).unwrap_err().contains("no wisp image at /escape"));
        // An absolute link inside the image resolves inside it.
        std::fs::create_dir_all(d.join("rootfs/opt")).unwrap();
        std::fs::write(d.join("rootfs/opt/app"), b"in the image").unwrap();
        std::os::unix::fs::symlink("/opt/app", d.join("rootfs/inside")).unwrap();
        std::fs::write(d.join("config.json"), r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"annotations":{"org.wisp.image":"/inside"}}"#).unwrap();
        let (_, fd) = read(&d).unwrap().image.unwrap();
        assert_eq!(std::fs::read_to_string(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd))).unwrap(), "in the image");
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn a_pods_sandbox_needs_no_image() {
        let d = bundle("sandbox", r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"annotations":{"io.kubernetes.cri.container-type":"sandbox","org.wisp.image":"/nope"}}"#);
        assert!(read(&d).unwrap().image.is_none());
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn namespaces_and_arguments() {
        let d = bundle("ns", r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"cwd":"/","user":{"uid":0,"gid":0},"args":["6380"]},"linux":{"namespaces":[{"type":"network"}]}}"#);
        let p = read(&d).unwrap();
        assert_eq!((p.netns, p.args, p.limits.memory), (Netns::New, vec!["6380".to_string()], None));
        let _ = std::fs::remove_dir_all(d);
        let d = bundle("host", r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{"cwd":"/","user":{"uid":0,"gid":0},"args":["image","x"]}}"#);
        let p = read(&d).unwrap();
        assert_eq!((p.netns, p.args), (Netns::Host, vec!["x".to_string()]));
        let _ = std::fs::remove_dir_all(d);
    }
}
