//! Generates the kubelet gRPC code from `proto/` with protox (a pure-Rust protobuf
//! compiler, so no `protoc` binary is needed) and tonic-prost-build.

use std::error::Error;

const PROTOS: &[&str] = &[
    "proto/dra/v1/api.proto",
    "proto/dra/v1beta1/api.proto",
    "proto/pluginregistration/v1/api.proto",
    "proto/dra-health/v1alpha1/api.proto",
    "proto/dra-health/v1beta1/api.proto",
    "proto/dra-health/v1/api.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        // Clients are part of the library for the test suite and for node tools (e.g.
        // calling the plugin's own sockets); without the transport, so no extra features.
        .build_client(true)
        .build_transport(false)
        // A malformed request is INVALID_ARGUMENT, not INTERNAL (src/plugin/proto.rs).
        .codec_path("crate::plugin::proto::codec::Codec")
        .compile_fds(fds)?;
    Ok(())
}
