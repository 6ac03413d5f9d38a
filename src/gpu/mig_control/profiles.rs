//! NVIDIA's GPU instance profiles for the GPUs the mock backend emulates, as
//! `nvidia-smi mig -lgip` and NVML report them: A100 40GB, A100 80GB and H100 80GB.
//! Every one of them has 8 memory slices and 7 compute slices. Memory sizes differ a little
//! between driver releases; these are the figures of NVIDIA's MIG user guide (A100 40GB:
//! 4.75, 9.62, 19.50 and 39.25 GiB) and of recent drivers' `-lgip` output (A100 80GB,
//! H100 80GB, whose `1g.20gb` has 26 multiprocessors, more than `1g.10gb`'s 16).

use super::{MigCapability, MigProfile, Placement};

/// One row: name, profile index, profile ID, compute slices, instances, SMs, copy engines,
/// decoders, encoders, JPEG, OFA, memory in MiB, placement size, placement starts.
type Row = (&'static str, u32, u32, u32, u32, u32, u32, u32, u32, u32, u32, u64, u32, &'static [u32]);

const ONE: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const TWO: &[u32] = &[0, 2, 4];
const ONE_WIDE: &[u32] = &[0, 2, 4, 6];
const THREE: &[u32] = &[0, 4];
const WHOLE: &[u32] = &[0];

const A100_40GB: &[Row] = &[
    ("7g.40gb", 0x4, 0, 7, 1, 98, 7, 5, 0, 1, 1, 40192, 8, WHOLE),
    ("4g.20gb", 0x3, 5, 4, 1, 56, 4, 2, 0, 0, 0, 19968, 4, WHOLE),
    ("3g.20gb", 0x2, 9, 3, 2, 42, 3, 2, 0, 0, 0, 19968, 4, THREE),
    ("2g.10gb", 0x1, 14, 2, 3, 28, 2, 1, 0, 0, 0, 9856, 2, TWO),
    ("1g.10gb", 0x9, 15, 1, 4, 14, 1, 1, 0, 0, 0, 9856, 2, ONE_WIDE),
    ("1g.5gb", 0x0, 19, 1, 7, 14, 1, 0, 0, 0, 0, 4864, 1, ONE),
    ("1g.5gb+me", 0x7, 20, 1, 1, 14, 1, 1, 0, 1, 1, 4864, 1, ONE),
];

const A100_80GB: &[Row] = &[
    ("7g.80gb", 0x4, 0, 7, 1, 98, 7, 5, 0, 1, 1, 80640, 8, WHOLE),
    ("4g.40gb", 0x3, 5, 4, 1, 56, 4, 2, 0, 0, 0, 40192, 4, WHOLE),
    ("3g.40gb", 0x2, 9, 3, 2, 42, 3, 2, 0, 0, 0, 40192, 4, THREE),
    ("2g.20gb", 0x1, 14, 2, 3, 28, 2, 1, 0, 0, 0, 19968, 2, TWO),
    ("1g.20gb", 0x9, 15, 1, 4, 14, 1, 1, 0, 0, 0, 19968, 2, ONE_WIDE),
    ("1g.10gb", 0x0, 19, 1, 7, 14, 1, 0, 0, 0, 0, 9728, 1, ONE),
    ("1g.10gb+me", 0x7, 20, 1, 1, 14, 1, 1, 0, 1, 1, 9728, 1, ONE),
];

const H100_80GB: &[Row] = &[
    ("7g.80gb", 0x4, 0, 7, 1, 132, 8, 7, 0, 7, 1, 81152, 8, WHOLE),
    ("4g.40gb", 0x3, 5, 4, 1, 64, 4, 4, 0, 4, 0, 40448, 4, WHOLE),
    ("3g.40gb", 0x2, 9, 3, 2, 60, 3, 3, 0, 3, 0, 40448, 4, THREE),
    ("2g.20gb", 0x1, 14, 2, 3, 32, 2, 2, 0, 2, 0, 20096, 2, TWO),
    ("1g.20gb", 0x9, 15, 1, 4, 26, 1, 1, 0, 1, 0, 20096, 2, ONE_WIDE),
    ("1g.10gb", 0x0, 19, 1, 7, 16, 1, 1, 0, 1, 0, 9984, 1, ONE),
    ("1g.10gb+me", 0x7, 20, 1, 1, 16, 1, 1, 0, 1, 1, 9984, 1, ONE),
];

/// The GPU models with a known profile table, by the product-name fragment that identifies
/// them and their memory in GiB (A100 comes in 40GB and 80GB under similar names).
const MODELS: &[(&str, u64, &[Row])] = &[("A100", 40, A100_40GB), ("A100", 80, A100_80GB), ("H100", 80, H100_80GB)];

/// The MIG capability of a GPU called `product_name` with `memory` bytes, when it is one of
/// the models with a known table (memory within 4 GiB of the model's nominal size).
pub fn for_model(product_name: &str, memory: u64) -> Option<MigCapability> {
    let gib = memory >> 30;
    let (_, _, rows) =
        MODELS.iter().find(|(fragment, nominal, _)| product_name.contains(fragment) && gib.abs_diff(*nominal) <= 4)?;
    Some(capability(rows))
}

fn capability(rows: &[Row]) -> MigCapability {
    let mut profiles: Vec<MigProfile> = rows
        .iter()
        .map(|&(name, index, id, slices, instances, sms, ce, dec, enc, jpg, ofa, mib, size, starts)| MigProfile {
            name: name.to_string(),
            index,
            id,
            slices,
            instances,
            multiprocessors: sms,
            copy_engines: ce,
            decoders: dec,
            encoders: enc,
            jpeg_engines: jpg,
            ofa_engines: ofa,
            memory: mib << 20,
            placements: starts.iter().map(|&start| Placement { start, size }).collect(),
        })
        .collect();
    profiles.sort_by_key(|p| p.id);
    let memory_slices =
        profiles.iter().flat_map(|p| p.placements.iter().map(|pl| pl.start.saturating_add(pl.size))).max().unwrap_or(0);
    MigCapability { memory_slices, profiles }
}

#[cfg(test)]
mod tests;
