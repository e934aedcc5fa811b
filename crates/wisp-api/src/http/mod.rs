//! A small HTTP/1.1 implementation for the daemon's Unix-socket API, in the spirit of Firecracker's
//! `micro_http`. The server side (`server.rs`: [`read_request`] and the response writers) parses one
//! request at a time from a [`BufRead`](std::io::BufRead) and answers bad input with a 4xx/5xx
//! [`HttpError`]: never a panic, an unbounded read or an allocation sized by the peer. The client side
//! ([`Client`], in `client.rs`) speaks keep-alive HTTP/1.1 over a `UnixStream` and reads
//! `Content-Length`, chunked and until-EOF bodies. What both share (limits, the error type, line and
//! header readers, percent-coding, reason phrases) is in `common.rs`.
//!
//! Request bodies need `Content-Length` (chunked requests get 411); `Expect: 100-continue` is not
//! answered (curl goes ahead after a second). After [`read_request`] fails the connection is in an
//! unknown state: answer with `write_error(.., keep_alive = false)` and close it.

mod client;
mod common;
mod server;
#[cfg(test)]
mod tests;

pub use client::{Client, Response};
pub use common::{
    percent_decode, percent_encode, reason, HttpError, CLIENT_MAX_BODY_BYTES, CLIENT_MAX_HEADER_BYTES, MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
};
pub use server::{
    end_chunked, read_request, start_chunked, start_chunked_with, write_chunk, write_error, write_json,
    write_response, Request,
};
