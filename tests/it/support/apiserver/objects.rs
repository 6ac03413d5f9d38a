//! Object helpers of the [`TestApiServer`] handle: Nodes, ResourceClaims (created and
//! allocated by the test, as the scheduler would) and ResourceSlices written or wiped by
//! other actors (the kubelet, an administrator). Handle writes bypass validation.

use serde_json::Value;

use super::{TestApiServer, meta};

impl TestApiServer {
    /// Adds a Node (idempotent); returns its uid.
    pub fn add_node(&self, name: &str) -> String {
        self.shared.mutate(|s| s.add_node(name))
    }

    /// Deletes a Node and, like the garbage collector, every slice with an ownerReference to
    /// its uid. Returns the number of slices collected, or `None` if the node did not exist.
    pub fn delete_node(&self, name: &str) -> Option<usize> {
        self.shared.mutate(|s| {
            let node = s.delete_node(name)?;
            let uid = node["metadata"]["uid"].clone();
            let owned: Vec<String> = s
                .slices
                .iter()
                .filter(|(_, slice)| {
                    slice["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
                })
                .map(|(k, _)| k.clone())
                .collect();
            Some(owned.iter().filter(|n| s.delete_slice(n).is_some()).count())
        })
    }

    /// Creates or replaces a ResourceClaim given in v1 shape (see [`super::ClaimBuilder`]); returns
    /// the stored object (uid kept across replacements unless the claim sets one).
    pub fn put_claim(&self, claim: Value) -> Value {
        self.shared.mutate(|s| s.put_claim(claim))
    }

    /// Replaces `status` of a stored claim; `None` if it does not exist.
    pub fn set_claim_status(&self, namespace: &str, name: &str, status: Value) -> Option<Value> {
        self.shared.mutate(|s| {
            let mut claim = s.claim(namespace, name)?;
            claim["status"] = status;
            Some(s.put_claim(claim))
        })
    }

    pub fn delete_claim(&self, namespace: &str, name: &str) -> Option<Value> {
        self.shared.mutate(|s| s.delete_claim(namespace, name))
    }

    /// Records that a pod on `node` uses the claim, so the node authorizer lets `node` get it.
    pub fn mark_claim_on_node(&self, namespace: &str, name: &str, node: &str) {
        self.shared.mutate(|s| {
            s.claim_nodes.entry((namespace.to_owned(), name.to_owned())).or_default().insert(node.to_owned())
        });
    }

    /// All stored slices (v1 shape with kind/apiVersion), ordered by name.
    pub fn slices(&self) -> Vec<Value> {
        self.shared.lock().slices()
    }

    pub fn slice(&self, name: &str) -> Option<Value> {
        self.shared.lock().slice(name)
    }

    /// Creates a slice as another writer would (no validation); returns the stored object.
    pub fn create_slice(&self, slice: Value) -> Value {
        let name = slice["metadata"]["name"].as_str().map_or_else(meta::random_suffix, str::to_owned);
        self.shared.mutate(|s| s.create_slice(&name, slice))
    }

    /// A foreign edit: applies `f` to the stored slice, bumps its resourceVersion and emits
    /// MODIFIED. `None` if the slice does not exist.
    pub fn edit_slice(&self, name: &str, f: impl FnOnce(&mut Value)) -> Option<Value> {
        self.shared.mutate(|s| {
            let mut slice = s.slices.get(name)?.clone();
            f(&mut slice);
            s.replace_slice(name, slice)
        })
    }

    /// Deletes one slice as the kubelet would; `true` if it existed.
    pub fn delete_slice_as_kubelet(&self, name: &str) -> bool {
        self.shared.mutate(|s| s.delete_slice(name).is_some())
    }

    /// Kubelet-style wipe: deletes every slice of `node` (and of `driver`, if given).
    /// Returns how many were deleted.
    pub fn delete_slices_where(&self, node: &str, driver: Option<&str>) -> usize {
        self.shared.mutate(|s| {
            let names: Vec<String> = s
                .slices
                .iter()
                .filter(|(_, v)| v["spec"]["nodeName"].as_str() == Some(node))
                .filter(|(_, v)| driver.is_none_or(|d| v["spec"]["driver"].as_str() == Some(d)))
                .map(|(k, _)| k.clone())
                .collect();
            names.iter().filter(|n| s.delete_slice(n).is_some()).count()
        })
    }
}
