//! A small, synchronous HTTP/1.1 implementation for the daemon's Unix-socket API, in the spirit of
//! Firecracker's `micro_http`; message heads and chunk sizes are parsed by `httparse`. The server side
//! (`server.rs`: [`read_request`], [`read_request_with`] and the response writers) frames one request
//! head at a time from a [`BufRead`](std::io::BufRead) within [`MAX_HEADER_BYTES`] (and
//! [`MAX_HEADERS`] fields), and answers bad input with a 4xx/5xx [`HttpError`]: never a panic, an
//! unbounded read or an allocation sized by the peer. The client side ([`Client`], in `client.rs`)
//! speaks keep-alive HTTP/1.1 over a `UnixStream`, reads `Content-Length`, chunked and until-EOF
//! bodies, and never sends a request twice when it may have reached the server. What both share
//! (limits, the error type, line and head readers, percent-coding, reason phrases) is in `common.rs`.
//!
//! Request bodies need `Content-Length` (chunked requests get 411). `Expect: 100-continue` is answered
//! with `100 Continue` before the body is read ([`read_request_with`]); any other expectation gets 417.
//! After a read fails the connection is in an unknown state: answer with
//! `write_error(.., keep_alive = false)` and close it.

mod client;
mod common;
mod server;
#[cfg(test)]
mod tests;

pub use client::{Client, Response};
pub use common::{
    percent_decode, percent_encode, reason, HttpError, CLIENT_MAX_BODY_BYTES, CLIENT_MAX_HEADER_BYTES, MAX_BODY_BYTES,
    MAX_HEADERS, MAX_HEADER_BYTES,
};
pub use server::{
    chunk_frame, chunked_head, end_chunked, read_request, read_request_with, start_chunked, start_chunked_with,
    write_chunk, write_error, write_json, write_response, write_response_with, exit_trailer, Request, LAST_CHUNK,
};
