use super::*;
use crate::dynamic_mig::tests::{instance, inventory};
use crate::gpu::mig_control::Placement;
use crate::inventory::MigInfo;

#[test]
fn mig_instances_are_edra_s_when_recorded_for_a_claim_and_foreign_otherwise() {
    let mut inv = inventory(3);
    inv.mig_gpus[0].instances = vec![instance(1, 9, 0, 4), instance(2, 9, 4, 4)];
    let (gpu0, gpu1) = (inv.mig_gpus[0].uuid.clone(), inv.mig_gpus[1].uuid.clone());
    // gpu-0: one of its two instances is edra's; gpu-1: one edra is creating (not yet
    // discovered); gpu-2: none. A static MIG device of a GPU edra does not carve is foreign.
    let owned =
        OwnedInstances::from([(gpu0, Placement { start: 4, size: 4 }), (gpu1, Placement { start: 0, size: 1 })]);
    let mut static_mig = inv.devices[0].clone();
    static_mig.name = "gpu-5-mig-1-0".into();
    static_mig.kind = DeviceKind::Mig(MigInfo {
        parent_uuid: "GPU-55555555-aaaa-bbbb-cccc-dddddddddddd".into(),
        parent_minor: 5,
        parent_index: 5,
        gi: 1,
        ci: 0,
        profile: "1g.10gb".into(),
    });
    inv.devices.push(static_mig);

    let counts = mig_per_gpu(&inv, &owned);
    let expected = BTreeMap::from([
        ("gpu-0".to_string(), MigCount { edra: 1, foreign: 1 }),
        ("gpu-1".to_string(), MigCount { edra: 1, foreign: 0 }),
        ("gpu-2".to_string(), MigCount { edra: 0, foreign: 0 }),
        ("gpu-5".to_string(), MigCount { edra: 0, foreign: 1 }),
    ]);
    assert_eq!(counts, expected);
}
