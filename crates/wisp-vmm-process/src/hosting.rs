//! What a group's VM threads (`group.rs`, `recycle.rs`, `endpoint.rs`)
//! are given and may ask of their group: a leaf, so that the group knows
//! its kinds of threads and they know only this.

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use wisp_vmm::{Image, Shell};

use crate::state::Shared;

/// What a VM's thread may ask of its group.
pub(crate) trait Hosting: Send + Sync {
    /// A new shell of the group's size, entered once.
    fn fresh_shell(&self) -> wisp_vmm::Result<Shell>;
    /// A thread is done with a run (the group may make its next spare).
    fn run_done(&self);
}

/// What a VM's thread is given to run.
pub(crate) struct Job {
    pub(crate) shared: Arc<Shared>,
    pub(crate) image: Image,
    pub(crate) args: Vec<String>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) conn: UnixStream,
    pub(crate) attach: bool,
    pub(crate) client: Option<(UnixStream, Vec<u8>)>,
    pub(crate) received_ns: u64,
    pub(crate) data: Option<wisp_vmm::DataDevice>,
    /// Its NICs (a plain group's VM only).
    pub(crate) net: Vec<wisp_vmm::NetConfig>,
    pub(crate) stdin: bool,
    /// Shared libraries (a recycling group's: the application).
    pub(crate) libraries: Vec<wisp_vmm::devices::library::LibraryDevice>,
    /// The files of the image and libraries (device, inode): a recycler
    /// kept at its ready point serves a run of the same files.
    pub(crate) files: Vec<(u64, u64)>,
}
