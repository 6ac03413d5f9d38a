//! Support shared by the library's unit tests and the integration tests, which reach these
//! files by `#[path]` from tests/it/support: log lines captured on a test's thread, the C
//! compiler for test libraries, links planted as an unprivileged user, descriptors passed on a datagram socket, the nvidia-smi and MPS control stand-ins (`gpu`, with their scripts), a fake Jetson
//! (`tegra`), and the CDI project's JSON schema.

#[allow(dead_code)] // what only the integration tests use
pub mod captured_logs;
#[allow(dead_code)] // what only the integration tests use
pub mod cc;
pub mod gpu;
pub mod planted;
#[allow(dead_code)] // what only the integration tests use
pub mod tegra;
