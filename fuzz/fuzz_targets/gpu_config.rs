//! An opaque `GpuConfig`, alone and inside a ResourceClaim of each wire version.
#![no_main]

use edra::kube::ResourceApi;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = edra::fuzzing::gpu_config(data);
    for api in ResourceApi::PREFERENCE {
        let _ = edra::fuzzing::claim_configs(api, data);
    }
});
