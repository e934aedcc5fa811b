//! The wispd API: JSON types shared by the daemon, the `wisp` client, tests
//! and benchmarks, the actions both ends speak (`action`), and the
//! HTTP/1.1-over-Unix-socket plumbing they go over.
//! The API itself is documented in `docs/api.yaml` (OpenAPI 3).

pub mod action;
pub mod client;
pub mod http;
pub mod links;
pub mod types;

pub use links::*;
pub use types::*;

/// Default daemon socket.
pub const DEFAULT_SOCKET: &str = "/run/wisp/wispd.sock";
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/run/wisp/state";
/// Environment variable naming the daemon socket.
pub const SOCKET_ENV: &str = "WISP_SOCKET";
/// Prefix of every API path.
pub const API_PREFIX: &str = "/v1";
/// Response header of an attached create that names the new VM (the body
/// is its console).
pub const VM_ID_HEADER: &str = "X-Wisp-Vm-Id";
