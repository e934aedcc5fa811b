//! The wispd API: JSON types shared by the daemon, the `wisp` client, tests
//! and benchmarks, and the HTTP/1.1-over-Unix-socket plumbing they speak.
//! The API itself is documented in `docs/api.yaml` (OpenAPI 3).

pub mod client;
pub mod http;
pub mod types;

pub use types::*;

/// Default daemon socket.
pub const DEFAULT_SOCKET: &str = "/run/wisp/wispd.sock";
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/run/wisp/state";
/// Environment variable naming the daemon socket.
pub const SOCKET_ENV: &str = "WISP_SOCKET";
/// Prefix of every API path.
pub const API_PREFIX: &str = "/v1";
