//! Errors of the monitor's setup paths. What a *guest* does wrong is not an
//! error of the monitor: it ends that VM with a [`crate::StopReason`].

use std::io;

/// Result of monitor operations.
pub type Result<T> = std::result::Result<T, Error>;

/// Why the monitor could not create, load or start a VM.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `/dev/kvm` could not be opened.
    #[error("cannot open /dev/kvm: {0} (is KVM available, and may this user use it?)")]
    NoKvm(io::Error),
    /// A KVM ioctl failed.
    #[error("KVM {0} failed: {1}")]
    Kvm(&'static str, io::Error),
    /// A host system call failed.
    #[error("{0} failed: {1}")]
    Host(&'static str, io::Error),
    /// The image file could not be read.
    #[error("cannot read image {path}: {err}")]
    ImageRead {
        /// Path of the image.
        path: String,
        /// Underlying error.
        err: io::Error,
    },
    /// The image is not a valid wisp image.
    #[error("invalid image: {0}")]
    BadImage(String),
    /// The image was built for another ABI version.
    #[error("ABI mismatch: image built for wisp ABI v{image}, this monitor speaks v{monitor}")]
    AbiMismatch {
        /// Version in the image note.
        image: u32,
        /// Version of this monitor.
        monitor: u32,
    },
    /// The requested memory size cannot be used.
    #[error("{0}")]
    BadMemory(String),
    /// The arguments do not fit in the boot-info page.
    #[error("arguments too long: {0} bytes, at most {max} fit", max = wisp_abi::bootinfo::ARGS_MAX)]
    ArgsTooLong(usize),
    /// An argument contains a NUL byte.
    #[error("an argument contains a NUL byte")]
    ArgNul,
    /// The image needs something this monitor or this run cannot give
    /// (a feature, a device).
    #[error("{0}")]
    Unsupported(String),
    /// The devices given to a VM do not fit together.
    #[error("devices: {0}")]
    Devices(String),
    /// A forked child's VM could not be made.
    #[error("fork: {0}")]
    Fork(&'static str),
    /// A snapshot was refused.
    #[error("{0}")]
    Snapshot(#[from] SnapshotError),
    /// A guest shared library was refused.
    #[error("library: {0}")]
    Library(#[from] LibraryError),
    /// A guest-physical range lies outside guest RAM.
    #[error("guest range {addr:#x}+{len:#x} is outside guest RAM")]
    OutOfRange {
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
    },
}

/// Why a snapshot was refused (`crate::snapshot`), each with what it is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("not a wisp snapshot (it does not start with WISPSNAP)")]
    Foreign,
    #[error("snapshot format v{found}, this monitor reads v{want}")]
    Version { found: u32, want: u32 },
    #[error("snapshot made under wisp ABI v{found}, this monitor speaks v{want}", want = wisp_abi::ABI_VERSION)]
    Abi { found: u32 },
    #[error("truncated: {have} bytes, the snapshot says {want}")]
    Truncated { have: u64, want: u64 },
    #[error("digest mismatch: the file was altered or damaged")]
    Digest,
    #[error("snapshot for {want} MiB of guest RAM, {have} MiB here")]
    Memory { want: u64, have: u64 },
    #[error("malformed snapshot: {0}")]
    Malformed(String),
    #[error("snapshot: {0}")]
    Io(String),
}

/// Why a guest shared library was refused (`crate::library`), each with
/// what it is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LibraryError {
    #[error("not an ELF64 file")]
    NotElf,
    #[error("not a library for this monitor: {0}")]
    Format(String),
    #[error("not a shared object (ELF type {0}; an image is run, not loaded as a library)")]
    NotShared(u16),
    #[error("it asks for an interpreter (PT_INTERP): a guest library is loaded by the monitor")]
    Interpreter,
    #[error("it needs library {0}: a guest library links against nothing")]
    Needs(String),
    #[error("symbol {0} is undefined: a guest library links against nothing")]
    Undefined(String),
    #[error("segment {0} is writable and executable")]
    WritableCode(usize),
    #[error("segments {0} and {1} have other permissions and share a 2 MiB page (link with -z max-page-size=0x200000)")]
    SharedPage(usize, usize),
    #[error("relocation type {0} (a library takes RELATIVE, 64, GLOB_DAT and JUMP_SLOT only)")]
    Relocation(u32),
    #[error("its segments span {0:#x} bytes, more than the 64 MiB a library may")]
    TooBig(u64),
    #[error("malformed: {0}")]
    Malformed(String),
    #[error("signature: {0}")]
    Signature(String),
    #[error("not binary-compatible with the library it replaces: {0}")]
    Incompatible(String),
    #[error("refused by the image's policy: {0}")]
    Policy(String),
}
