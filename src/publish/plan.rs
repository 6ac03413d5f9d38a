//! What to change so the published slices match the desired ones — a pure function.
//!
//! [`plan`] compares the slices the API server has for this node and driver (as the
//! watcher sees them) with the desired slices for the inventory, and returns the deletes,
//! updates and creates that converge them, following Kubernetes' resourceslice
//! controller: slices are matched by the index encoded in their name within the current
//! pool generation; anything else of ours is obsolete and deleted with
//! preconditions; the pool generation is bumped when more than one slice changes or new
//! slices are needed, so the scheduler never mixes two versions of the pool. When nothing
//! differs the plan is empty: zero writes at steady state.

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::desired::{self, NodeIdentity};
use super::taints::DeviceTaints;
use crate::inventory::Inventory;

/// A slice to delete, with the preconditions that make the delete safe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    /// Object name.
    pub name: String,
    /// UID precondition.
    pub uid: String,
    /// resourceVersion precondition.
    pub resource_version: String,
}

/// The writes that converge the pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// The pool generation the plan writes.
    pub generation: i64,
    /// Obsolete slices, deleted first.
    pub deletes: Vec<Delete>,
    /// Existing slices to replace (name, uid and resourceVersion set).
    pub updates: Vec<ResourceSlice>,
    /// New slices (generateName set).
    pub creates: Vec<ResourceSlice>,
}

impl Plan {
    /// True when the API already matches.
    pub fn is_empty(&self) -> bool {
        self.deletes.is_empty() && self.updates.is_empty() && self.creates.is_empty()
    }
    /// Number of API writes the plan makes.
    pub fn writes(&self) -> usize {
        self.deletes.len() + self.updates.len() + self.creates.len()
    }
}

fn generation_of(s: &ResourceSlice) -> i64 {
    s.spec.pool.generation
}

fn delete_of(s: &ResourceSlice) -> Option<Delete> {
    Some(Delete {
        name: s.metadata.name.clone()?,
        uid: s.metadata.uid.clone().unwrap_or_default(),
        resource_version: s.metadata.resource_version.clone().unwrap_or_default(),
    })
}

/// Computes the writes that make `observed` (this node's and driver's slices as the API
/// server has them) equal to the desired slices for `inventory`. `min_generation` is the
/// highest generation this process has written, so a pool wiped by the kubelet comes
/// back with a newer generation.
pub fn plan(
    observed: &[ResourceSlice],
    inventory: &Inventory,
    node: &NodeIdentity,
    driver: &str,
    min_generation: i64,
) -> Plan {
    plan_tainted(observed, inventory, &DeviceTaints::new(), node, driver, min_generation)
}

/// [`plan`] for slices whose devices carry `taints`. A taint change confined to one slice
/// is one update in the same generation (no pool generation bump), as KEP-5055 allows.
pub fn plan_tainted(
    observed: &[ResourceSlice],
    inventory: &Inventory,
    taints: &DeviceTaints,
    node: &NodeIdentity,
    driver: &str,
    min_generation: i64,
) -> Plan {
    let ours = |s: &&ResourceSlice| s.spec.driver == driver && s.spec.pool.name == node.name;
    let current_gen = observed.iter().filter(ours).map(generation_of).max().unwrap_or(0).max(min_generation);
    let want = desired::desired_tainted_slices(inventory, taints, node, driver, current_gen);

    // Match observed slices of the current generation to desired indices.
    let mut matched: Vec<Option<&ResourceSlice>> = vec![None; want.len()];
    let mut obsolete: Vec<&ResourceSlice> = Vec::new();
    let mut sorted: Vec<&ResourceSlice> = observed.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for s in sorted {
        let index = s.metadata.name.as_deref().and_then(desired::slice_index).and_then(|i| usize::try_from(i).ok());
        match index {
            Some(i) if ours(&s) && generation_of(s) == current_gen && i < want.len() && matched[i].is_none() => {
                matched[i] = Some(s);
            }
            _ => obsolete.push(s),
        }
    }

    let changed = |i: usize, w: &ResourceSlice| matched[i].is_some_and(|s| !desired::same_content(s, w));
    let creates_needed = matched.iter().any(Option::is_none);
    let changes = want.iter().enumerate().filter(|(i, w)| changed(*i, w)).count();
    let generation = desired::next_generation(Some(current_gen), usize::from(creates_needed), changes, 0);
    let want = if generation == current_gen {
        want
    } else {
        desired::desired_tainted_slices(inventory, taints, node, driver, generation)
    };

    let mut out = Plan { generation, ..Plan::default() };
    out.deletes = obsolete.into_iter().filter_map(delete_of).collect();
    for (i, mut w) in want.into_iter().enumerate() {
        match matched[i] {
            Some(s) if desired::same_content(s, &w) && generation_of(s) == generation => {}
            Some(s) => {
                w.metadata.name = s.metadata.name.clone();
                w.metadata.generate_name = None;
                w.metadata.uid = s.metadata.uid.clone();
                w.metadata.resource_version = s.metadata.resource_version.clone();
                out.updates.push(w);
            }
            None => out.creates.push(w),
        }
    }
    out
}

#[cfg(test)]
pub(super) mod tests;
