//! Who may use the API. The socket is made owner-only (0600) from the start
//! (bound under umask 0177), then handed to the API group (`--socket-group`,
//! default `wisp`) with mode 0660 when that group exists; without it the API
//! stays root-only and the log says so. The kernel's credentials of every
//! connecting peer are checked as well (`SO_PEERCRED`, `SO_PEERGROUPS`:
//! as they were at `connect`), so a socket whose mode was widened, or a
//! descriptor passed on, still lets in only root, the daemon's own user and
//! members of the group.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;

/// The policy of one API socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// The daemon's own user (root in production), always let in.
    owner: u32,
    /// The group let in, by name and id; `None`: root and the owner only.
    group: Option<(String, u32)>,
    /// The group asked for, for messages.
    wanted: String,
}

/// Credentials of a connected peer, as the kernel recorded them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Process id at connect time.
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Access {
    /// Whether `peer` may use the API: root, the daemon's own user, or a
    /// member of the group (primary or supplementary). `Err`: the answer
    /// for a refused peer.
    pub fn allows(&self, peer: &Peer) -> Result<(), String> {
        let member = |gid| peer.gid == gid || peer.groups.contains(&gid);
        match &self.group {
            _ if peer.uid == 0 || peer.uid == self.owner => Ok(()),
            Some((_, gid)) if member(*gid) => Ok(()),
            Some((name, gid)) => Err(format!(
                "permission denied: uid {} is neither root nor a member of group '{name}' (gid {gid})",
                peer.uid
            )),
            None => Err(format!(
                "permission denied: the API is root-only (group '{}' does not exist on this host)",
                self.wanted
            )),
        }
    }

    /// Check the peer of a freshly accepted connection.
    pub fn check(&self, conn: impl AsFd) -> Result<Peer, (Option<Peer>, String)> {
        let peer = peer(conn.as_fd()).map_err(|e| (None, format!("cannot read the peer's credentials: {e}")))?;
        match self.allows(&peer) {
            Ok(()) => Ok(peer),
            Err(m) => Err((Some(peer), m)),
        }
    }
}

/// Bind the API socket at `path` owner-only, then open it to `group` (a
/// name, or a numeric gid) with mode 0660 when the group exists. Returns
/// the listener, the policy, and a line for the log.
pub fn bind(path: &Path, group: &str) -> Result<(UnixListener, Access, String), String> {
    use rustix::fs::Mode;
    // umask is per process; the daemon has no other thread yet.
    let old = rustix::process::umask(Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(path);
    rustix::process::umask(old);
    let listener = bound.map_err(|e| format!("bind {}: {e}", path.display()))?;
    let set_mode = |mode| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
    set_mode(0o600).map_err(|e| format!("chmod {}: {e}", path.display()))?;
    let owner = rustix::process::geteuid().as_raw();
    let mut access = Access { owner, group: None, wanted: group.to_string() };
    let note = match lookup_group(group) {
        Ok(Some(gid)) => match std::os::unix::fs::chown(path, None, Some(gid)).and_then(|()| set_mode(0o660)) {
            Ok(()) => {
                access.group = Some((group.to_string(), gid));
                format!("API socket {}: mode 0660, group '{group}' (gid {gid})", path.display())
            }
            Err(e) => format!(
                "API socket {}: cannot give it to group '{group}' ({e}): root-only (0600)",
                path.display()
            ),
        },
        Ok(None) => format!(
            "API socket {}: group '{group}' does not exist: root-only (0600); create the group \
             (groupadd {group}) or choose one with --socket-group",
            path.display()
        ),
        Err(e) => format!("API socket {}: cannot look up group '{group}' ({e}): root-only (0600)", path.display()),
    };
    Ok((listener, access, note))
}

/// The id of group `name` (or `name` itself when it is a number); `None`
/// when there is no such group.
pub fn lookup_group(name: &str) -> io::Result<Option<u32>> {
    if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
        return name.parse().map(Some).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "gid out of range"));
    }
    let cname = CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in group name"))?;
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: `group` is plain data that getgrnam_r fills in; `buf`
        // (its strings) is valid for `buf.len()` bytes and outlives the
        // call; `result` is a valid out-pointer.
        let (r, found) = unsafe {
            let mut group: libc::group = std::mem::zeroed();
            let mut result: *mut libc::group = std::ptr::null_mut();
            let r = libc::getgrnam_r(cname.as_ptr(), &mut group, buf.as_mut_ptr().cast(), buf.len(), &mut result);
            (r, (!result.is_null()).then_some(group.gr_gid))
        };
        match r {
            0 => return Ok(found),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            e => return Err(io::Error::from_raw_os_error(e)),
        }
    }
}

/// The credentials of the process at the other end of a Unix socket
/// (`SO_PEERCRED` by hand: its pid is 0 for a peer outside our pid
/// namespace, which `rustix`'s non-zero `Pid` cannot hold).
pub fn peer(fd: BorrowedFd<'_>) -> io::Result<Peer> {
    let mut cred = libc::ucred { pid: 0, uid: u32::MAX, gid: u32::MAX };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is valid for `len` bytes of writes, and `len` is a
    // valid in/out length.
    let r = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &mut len)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "short SO_PEERCRED answer"));
    }
    Ok(Peer { pid: cred.pid, uid: cred.uid, gid: cred.gid, groups: peer_groups(fd)? })
}

/// `SO_PEERGROUPS`: the peer's supplementary groups at connect time.
fn peer_groups(fd: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let mut groups = vec![0u32; 64];
    loop {
        let mut len = (groups.len() * 4) as libc::socklen_t;
        // SAFETY: `groups` is valid for `len` bytes of writes, and `len` is
        // a valid in/out length.
        let r = unsafe {
            libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERGROUPS, groups.as_mut_ptr().cast(), &mut len)
        };
        let n = len as usize / 4;
        if r == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        // ERANGE: the kernel put the size it needs in `len` (at most NGROUPS_MAX).
        if e.raw_os_error() != Some(libc::ERANGE) || n <= groups.len() || n > 65536 {
            return Err(e);
        }
        groups.resize(n, 0);
    }
}


/// Open `path` (read-only, or read-write with `write`) as `peer` would:
/// on a thread of its own whose file-system user and groups are the
/// peer's (per-thread raw `setgroups`, `setfsgid`, `setfsuid`: the rest of
/// the daemon keeps its own), so the kernel checks every directory on the
/// way and the file itself against the client's rights, not the daemon's.
/// A link is followed as the client's own `open` would follow it, its
/// target checked as the client too.
pub fn open_as(peer: &Peer, path: &Path, write: bool) -> io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(write);
    open_as_with(peer, path, o)
}

/// Create (or truncate) `path` for reading and writing as `peer` would,
/// owned by the peer, readable by it alone (a snapshot holds a VM's
/// memory): as [`open_as`].
pub fn create_as(peer: &Peer, path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true).create(true).truncate(true).mode(0o600);
    open_as_with(peer, path, o)
}

/// Whether `peer`'s file-system identity is the daemon's own: its user,
/// its group and its supplementary groups (as sets).
fn is_ours(peer: &Peer) -> bool {
    // SAFETY: these calls only read this process's credentials.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if peer.uid != uid || peer.gid != gid {
        return false;
    }
    let mut ours = vec![0 as libc::gid_t; 256];
    // SAFETY: `ours` has room for 256 groups, as the call is told.
    let n = unsafe { libc::getgroups(ours.len() as i32, ours.as_mut_ptr()) };
    if n < 0 {
        return false;
    }
    ours.truncate(n as usize);
    let (mut a, mut b) = (ours, peer.groups.clone());
    a.sort_unstable();
    a.dedup();
    b.sort_unstable();
    b.dedup();
    a == b
}

/// [`open_as`] with the open's options.
fn open_as_with(peer: &Peer, path: &Path, options: std::fs::OpenOptions) -> io::Result<std::fs::File> {
    // A client with the daemon's own credentials: the open is the same on
    // this thread (no thread to take them on, ~0.2 ms of a request).
    if is_ours(peer) {
        return options.open(path);
    }
    let (uid, gid, groups, path) = (peer.uid, peer.gid, peer.groups.clone(), path.to_path_buf());
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: raw syscalls on this thread's own credentials (glibc's
            // wrappers would change every thread's); `groups` is valid for
            // its length. The thread ends right after the open.
            unsafe {
                if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0 {
                    return Err(io::Error::last_os_error());
                }
                libc::syscall(libc::SYS_setfsgid, gid);
                libc::syscall(libc::SYS_setfsuid, uid);
                // setfsuid reports no error: the thread's fsuid must be the
                // peer's now (asked with an invalid id, it answers the
                // current one).
                if libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32 != uid
                    || libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32 != gid
                {
                    return Err(io::Error::new(io::ErrorKind::PermissionDenied, "cannot take the client's file-system identity"));
                }
            }
            options.open(&path)
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the open thread panicked")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_the_owner_and_group_members_only() {
        let a = Access { owner: 1000, group: Some(("wisp".into(), 500)), wanted: "wisp".into() };
        let p = |uid, gid, groups: &[u32]| Peer { pid: 1, uid, gid, groups: groups.to_vec() };
        assert!(a.allows(&p(0, 0, &[])).is_ok());
        assert!(a.allows(&p(1000, 1000, &[])).is_ok());
        assert!(a.allows(&p(2000, 500, &[])).is_ok());
        assert!(a.allows(&p(2000, 2000, &[4, 500])).is_ok());
        let e = a.allows(&p(2000, 2000, &[4])).unwrap_err();
        assert_eq!(e, "permission denied: uid 2000 is neither root nor a member of group 'wisp' (gid 500)");
        let root_only = Access { owner: 0, group: None, wanted: "wisp".into() };
        assert!(root_only.allows(&p(0, 0, &[])).is_ok());
        let e = root_only.allows(&p(2000, 500, &[500])).unwrap_err();
        assert_eq!(e, "permission denied: the API is root-only (group 'wisp' does not exist on this host)");
    }

    #[test]
    fn groups_are_looked_up_by_name_or_number() {
        assert_eq!(lookup_group("root").unwrap(), Some(0));
        assert_eq!(lookup_group("4242").unwrap(), Some(4242));
        assert_eq!(lookup_group("no-such-group-wisp-test").unwrap(), None);
        assert!(lookup_group("99999999999").is_err());
        assert!(lookup_group("a\0b").is_err());
    }

    #[test]
    fn a_socket_pair_reports_our_own_credentials() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let me = peer(a.as_fd()).unwrap();
        assert_eq!((me.uid, me.gid), (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw()));
        assert_eq!(me.pid as u32, std::process::id());
        // Ours: opened on the calling thread; anyone else's differ.
        assert!(is_ours(&me));
        assert!(!is_ours(&Peer { uid: me.uid.wrapping_add(1), ..me.clone() }));
        assert!(!is_ours(&Peer { groups: vec![4242], ..me.clone() }) || me.groups == [4242]);
    }
}
