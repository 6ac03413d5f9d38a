//! Integration tests: real HTTPS to the in-process test API server, real gRPC over real
//! Unix sockets, real sled on temp dirs, the real nvml-wrapper loading a stand-in library.
//! One test binary (modules below) keeps link time down.

mod cli_inventory;
mod inventory_nvml;
mod manifests;
mod packaging;
mod support;
