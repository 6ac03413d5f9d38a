use super::*;

#[test]
fn names_like_nvidia_smi() {
    assert_eq!(profile_name(sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE, 1, 10), "1g.10gb");
    assert_eq!(profile_name(sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 10), "1g.10gb+me");
    assert_eq!(profile_name(sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1, 2, 12), "2g.12gb+me");
    assert_eq!(profile_name(sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 1, 20), "1g.20gb");
    assert_eq!(profile_name(sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX, 1, 24), "1g.24gb+gfx");
    assert_eq!(profile_name(sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, 1, 24), "1g.24gb-me");
    assert_eq!(profile_name(sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, 1, 24), "1g.24gb+me.all");
    assert_eq!(profile_name(sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE, 7, 80), "7g.80gb");
}

#[test]
fn compute_profiles_by_slices() {
    assert_eq!(ci_profile_index(3), Some(sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE));
    assert_eq!(ci_profile_index(7), Some(sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE));
    assert_eq!(ci_profile_index(5), None);
    assert_eq!(ci_profile_index(0), None);
}
