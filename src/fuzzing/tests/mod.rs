//! Property tests of the fuzz targets' library functions with proptest: hostile input
//! generators (`hostile`) and one suite per surface (the gRPC authority rewriter, the OCI
//! hooks, the API client's decoders and the claim configuration).

mod authority;
mod hook;
mod hostile;
mod kube;
