use super::*;

#[test]
fn enum_names() {
    assert_eq!(brand_name(2), Some("Tesla"));
    assert_eq!(brand_name(14), Some("Nvidia"));
    assert_eq!(brand_name(0), None);
    assert_eq!(brand_name(99), None);
    assert_eq!(architecture_name(7), Some("Ampere"));
    assert_eq!(architecture_name(8), Some("Ada Lovelace"));
    assert_eq!(architecture_name(u32::MAX), None);
}
