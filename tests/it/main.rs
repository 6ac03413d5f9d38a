//! Integration tests: real HTTPS to the in-process test API server, real gRPC over real
//! Unix sockets, real sled on temp dirs, the real nvml-wrapper loading a stand-in library.
//! One test binary (modules below) keeps link time down.

mod agent;
mod apiserver_selftest;
mod cli_inventory;
mod cli_usage;
mod doctor;
mod footprint;
mod health_nvml;
mod hook;
mod inventory_nvml;
mod kube_client;
mod layers;
mod manifests;
mod metrics;
mod mig_nvml;
mod monitoring;
mod packaging;
mod plugin_grpc;
mod runtime;
mod runtime_jetson;
mod runtime_memory_limit;
mod selftest;
mod shape;
mod support;
