use super::*;

#[test]
fn known_models_and_their_tables() {
    let a40 = for_model("NVIDIA A100-SXM4-40GB", 40 << 30).expect("A100 40GB");
    let a80 = for_model("NVIDIA A100-SXM4-80GB", 80 << 30).expect("A100 80GB");
    let h80 = for_model("NVIDIA H100 80GB HBM3", 80 << 30).expect("H100 80GB");
    assert!(for_model("NVIDIA A100-SXM4-80GB", 24 << 30).is_none(), "memory decides the table");
    assert!(for_model("Tesla T4", 16 << 30).is_none());
    for cap in [&a40, &a80, &h80] {
        assert_eq!(cap.memory_slices, 8);
        assert_eq!(cap.profiles.len(), 7);
        for p in &cap.profiles {
            assert!(p.placements.len() as u32 >= p.instances, "{}", p.name);
            for pl in &p.placements {
                assert!(pl.start + pl.size <= cap.memory_slices, "{} {pl}", p.name);
            }
        }
    }
    let three = a80.profiles.iter().find(|p| p.name == "3g.40gb").expect("3g.40gb");
    assert_eq!((three.id, three.memory, three.placements.len()), (9, 40192 << 20, 2));
    assert!(!three.placements[0].overlaps(&three.placements[1]));
    let seven = a80.profile(0).expect("7g.80gb");
    assert!(seven.placements[0].overlaps(&three.placements[1]));
    assert_eq!(a40.profile(19).map(|p| p.name.as_str()), Some("1g.5gb"));
    assert_eq!(h80.profile(9).map(|p| p.multiprocessors), Some(60));
}
