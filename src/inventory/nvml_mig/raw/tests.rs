use super::*;

#[test]
fn error_codes_in_words() {
    assert_eq!(describe(INSUFFICIENT_RESOURCES), "insufficient resources (NVML error 23)");
    assert_eq!(
        describe(sys::nvmlReturn_enum_NVML_ERROR_IN_USE),
        "operation cannot be performed because the GPU is currently in use (NVML error 19)"
    );
    assert!(describe(4242).ends_with("(NVML error 4242)"));
}
