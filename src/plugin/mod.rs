//! The kubelet's gRPC APIs on Unix sockets: plugin registration and DRAPlugin v1/v1beta1.

pub mod authority;
pub mod handler;
pub mod proto;
