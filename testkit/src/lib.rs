//! Helpers the workspace's tests share: the library's, the proxy's,
//! ratecheck's and the agent service's. Test code: it panics on what a test
//! would not expect.
#![allow(missing_docs)]
// `TestCa::new()` makes keys: a `Default` doing that would surprise.
#![allow(clippy::new_without_default)]

pub mod capture;
#[cfg(unix)]
pub mod child;
pub mod fuzz_replay;
pub mod local_server;
pub mod redis;
#[cfg(feature = "tls")]
pub mod tls_upstream;
pub mod windows;
