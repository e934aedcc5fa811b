//! Host port forwarding (`wisp run -p HOSTPORT:VMPORT`): a listening TCP
//! socket on the host per mapping; each connection is joined to a new
//! connection to the VM's address, bytes copied both ways by two threads.

use std::io;
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;

use wisp_api::PortMap;

/// A running forward; stopped (listener closed) on drop.
pub struct Forward {
    listener: Arc<TcpListener>,
}

impl Forward {
    /// Listen on `map.host` (all host addresses) and forward to `vm_ip:map.vm`.
    pub fn start(map: PortMap, vm_ip: Ipv4Addr) -> io::Result<Forward> {
        let listener = Arc::new(TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], map.host)))?);
        let l = listener.clone();
        let target = SocketAddr::from((vm_ip, map.vm));
        std::thread::Builder::new().name(format!("fwd{}", map.host)).spawn(move || {
            for conn in l.incoming() {
                let Ok(client) = conn else { break };
                let _ = std::thread::Builder::new().spawn(move || {
                    if let Ok(vm) = TcpStream::connect_timeout(&target, std::time::Duration::from_secs(5)) {
                        splice(client, vm);
                    }
                });
            }
        })?;
        Ok(Forward { listener })
    }

    /// Forward every mapping of a new VM: all of them, or none (those
    /// started are stopped again) and the mapping that failed, with why.
    pub fn start_all(maps: &[PortMap], vm_ip: Ipv4Addr) -> Result<Vec<Forward>, (PortMap, io::Error)> {
        maps.iter().map(|m| Forward::start(*m, vm_ip).map_err(|e| (*m, e))).collect()
    }

    /// Forward the mappings of a re-adopted VM `vm` again: those that
    /// cannot be are logged and skipped.
    pub fn restore(vm: &str, maps: &[PortMap], vm_ip: Ipv4Addr) -> Vec<Forward> {
        maps.iter()
            .filter_map(|m| match Forward::start(*m, vm_ip) {
                Ok(f) => Some(f),
                Err(e) => {
                    eprintln!("wispd: VM {vm}: cannot forward host port {} again: {e}", m.host);
                    None
                }
            })
            .collect()
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        // Wakes the accept loop with an error, which ends it.
        let _ = rustix::net::shutdown(&*self.listener, rustix::net::Shutdown::Both);
    }
}

/// Copy both directions until each side has finished.
fn splice(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else { return };
    let t = std::thread::spawn(move || {
        let (mut from, mut to) = (a2, b2);
        let _ = io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
    let (mut from, mut to) = (b, a);
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
    let _ = t.join();
}
