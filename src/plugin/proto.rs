//! Generated protobuf messages and gRPC services for the kubelet's APIs, compiled by
//! `build.rs` from edra's own `.proto` files under `proto/`.
//!
//! Servers are what edra runs. Clients are generated too (without a transport, so any
//! tower service works as the channel): the integration tests play the kubelet with them,
//! and node tools can use them to call the plugin's own sockets.

/// `k8s.io.kubelet.pkg.apis.dra.v1`: DRAPlugin v1 (kubelet 1.34+), with `Device.share_id`.
pub mod dra_v1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1`: DRAPlugin v1beta1 (kubelet 1.32+), no `share_id`.
pub mod dra_v1beta1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// `pluginregistration`: the kubelet plugin watcher's Registration service.
pub mod registration {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("pluginregistration");
}

/// `v1alpha1`: the DRAResourceHealth device health stream (kubelet 1.34+).
pub mod health_v1alpha1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("v1alpha1");
}
