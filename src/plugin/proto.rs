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

/// `v1beta1`: the same stream as `v1alpha1`, as newer kubelets call it.
pub mod health_v1beta1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("v1beta1");
}

/// `v1`: the same stream as `v1alpha1`, as newer kubelets call it.
pub mod health_v1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("v1");
}

/// The gRPC codec of the services above: prost's, except that a request that is not a
/// valid protobuf message is the caller's fault and answered `INVALID_ARGUMENT` (prost's
/// codec says `INTERNAL`, which reads as a bug in edra). Wired in by `build.rs`.
pub mod codec {
    use tonic::codec::{BufferSettings, DecodeBuf};
    use tonic::{Code, Status};
    use tonic_prost::prost::Message;
    use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

    /// [`ProstCodec`] with decode errors as `INVALID_ARGUMENT`.
    #[derive(Debug, Clone)]
    pub struct Codec<T, U>(ProstCodec<T, U>);

    impl<T, U> Default for Codec<T, U> {
        fn default() -> Self {
            Codec(ProstCodec::default())
        }
    }

    impl<T, U> tonic::codec::Codec for Codec<T, U>
    where
        T: Message + Send + 'static,
        U: Message + Default + Send + 'static,
    {
        type Encode = T;
        type Decode = U;
        type Encoder = ProstEncoder<T>;
        type Decoder = Decoder<U>;

        fn encoder(&mut self) -> Self::Encoder {
            self.0.encoder()
        }

        fn decoder(&mut self) -> Self::Decoder {
            Decoder(self.0.decoder())
        }
    }

    /// [`ProstDecoder`] with decode errors as `INVALID_ARGUMENT`.
    #[derive(Debug)]
    pub struct Decoder<U>(ProstDecoder<U>);

    impl<U: Message + Default> tonic::codec::Decoder for Decoder<U> {
        type Item = U;
        type Error = Status;

        fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
            self.0.decode(buf).map_err(|s| match s.code() {
                Code::Internal => Status::invalid_argument(format!("not a valid protobuf message: {}", s.message())),
                _ => s,
            })
        }

        fn buffer_settings(&self) -> BufferSettings {
            self.0.buffer_settings()
        }
    }
}
