//! Claims fetched before the kubelet asks (`claims.prefetch`).
//!
//! The pods bound to this node are watched ([`watch_pods`]); when a pod that has not started
//! yet names ResourceClaims, each is read at once, a few at a time, and only when the
//! client's rate limit has a token free (so these reads never queue ahead of the kubelet's).
//! A claim that is allocated and reserved is kept in a small cache keyed by
//! `(namespace, name)`: at most [`CAPACITY`] entries, the oldest evicted first, each for at
//! most [`EXPIRY`]. Its allocation is immutable once set, so the kubelet's prepare uses the
//! cached claim when its UID is the one the kubelet names ([`ClaimSource::claim_for`]); a
//! claim deleted and created again under the same name is read afresh.
//!
//! One read per claim at a time: a prepare arriving while the early read is in flight
//! waits for that read rather than sending its own (if the read fails, or answers with
//! another UID, the prepare reads the claim itself within its deadline); an early read
//! arriving while the prepare's own read is in flight, or after the claim was prepared, is
//! not sent (a small marker without the claim stays for [`EXPIRY`]). Kept claims go when
//! their pod starts, ends or is deleted, and after a successful prepare used them.
//! Unprepare never reads claims, so it never sees this cache.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use super::{ClaimFetchError, ClaimSource};
use crate::plugin::ClaimRef;

mod watching;

pub use watching::watch_pods;

/// Claims kept at most; the oldest goes first.
pub const CAPACITY: usize = 1024;
/// How long a fetched claim is kept for the kubelet's call.
pub const EXPIRY: Duration = Duration::from_secs(120);
/// Claims read early at once.
pub const AT_ONCE: usize = 8;
/// How long an early read may take: a prepare that waits for it keeps the rest of its own
/// budget to read the claim itself.
pub const EARLY_BUDGET: Duration = Duration::from_secs(5);

/// Pauses before an early read refused by the API server is tried again (see
/// [`Prefetcher::fetch_early`]).
pub const FORBIDDEN_RETRIES: [Duration; 2] = [Duration::from_millis(20), Duration::from_millis(80)];

type Key = (String, String);

enum Slot {
    /// A read is in flight; its claim arrives on the channel (the sender dropped unsent
    /// when it failed or was the kubelet's own).
    Flying(watch::Receiver<Option<Arc<ResourceClaim>>>),
    /// A claim allocated and reserved, read at `at`.
    Ready { claim: Arc<ResourceClaim>, at: Instant },
    /// Read by a prepare itself or prepared since `at`: an early read would come too late.
    Taken { at: Instant },
}

/// How a flight ends.
enum Landing {
    Keep(Arc<ResourceClaim>),
    Taken,
    Drop,
}

struct Entry {
    slot: Slot,
    /// Insertion order, for eviction and to tell a flight's own entry from a newer one.
    seq: u64,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<Key, Entry>,
    order: BTreeMap<u64, Key>,
    next: u64,
}

impl Cache {
    /// The live entry of `key`; an expired one, or a flight whose reader went away (a
    /// prepare the kubelet cancelled), is dropped.
    fn live(&mut self, key: &Key, now: Instant) -> Option<&Entry> {
        let dead = match self.entries.get(key) {
            Some(e) => !alive(e, now),
            None => return None,
        };
        if dead {
            self.remove(key);
            return None;
        }
        self.entries.get(key)
    }

    /// Adds an in-flight entry for `key` (evicting the oldest beyond [`CAPACITY`]).
    fn fly(&mut self, key: Key) -> (u64, watch::Sender<Option<Arc<ResourceClaim>>>) {
        self.remove(&key);
        // Expired entries nobody asked for again go here, so they never pile up.
        let now = Instant::now();
        let Cache { entries, order, .. } = self;
        entries.retain(|_, e| alive(e, now));
        order.retain(|_, k| entries.contains_key(k));
        while self.entries.len() >= CAPACITY {
            let Some((_, oldest)) = self.order.pop_first() else { break };
            self.entries.remove(&oldest);
        }
        let seq = self.next;
        self.next = self.next.wrapping_add(1);
        let (tx, rx) = watch::channel(None);
        self.order.insert(seq, key.clone());
        self.entries.insert(key, Entry { slot: Slot::Flying(rx), seq });
        (seq, tx)
    }

    /// Ends flight `seq` of `key`. A newer entry of the key (the flight was evicted or
    /// forgotten meanwhile) is left alone.
    fn land(&mut self, key: &Key, seq: u64, landing: Landing) {
        let Some(entry) = self.entries.get_mut(key).filter(|e| e.seq == seq) else { return };
        match landing {
            Landing::Keep(claim) => entry.slot = Slot::Ready { claim, at: Instant::now() },
            Landing::Taken => entry.slot = Slot::Taken { at: Instant::now() },
            Landing::Drop => self.remove(key),
        }
    }

    fn remove(&mut self, key: &Key) {
        if let Some(e) = self.entries.remove(key) {
            self.order.remove(&e.seq);
        }
    }
}

/// Whether `entry` still counts at `now`: not expired, or a flight someone still reads.
fn alive(entry: &Entry, now: Instant) -> bool {
    match &entry.slot {
        Slot::Ready { at, .. } | Slot::Taken { at } => now.saturating_duration_since(*at) < EXPIRY,
        Slot::Flying(rx) => rx.has_changed().is_ok(),
    }
}

/// Whether the cache may keep `claim`: allocated (then immutable) and reserved.
fn cacheable(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .is_some_and(|s| s.allocation.is_some() && s.reserved_for.as_ref().is_some_and(|r| !r.is_empty()))
}

/// Whether the kubelet's prepare of `uid` may use `claim`: the same object, allocated.
fn usable(claim: &ResourceClaim, uid: &str) -> bool {
    claim.metadata.uid.as_deref() == Some(uid) && claim.status.as_ref().is_some_and(|s| s.allocation.is_some())
}

/// What a prepare found for its claim.
enum Found {
    Cached(Arc<ResourceClaim>),
    InFlight(watch::Receiver<Option<Arc<ResourceClaim>>>),
    /// Nothing: the prepare reads it, as flight `seq` (the sender is dropped when done).
    Own(u64, watch::Sender<Option<Arc<ResourceClaim>>>),
}

/// What [`Prefetcher::fetch_early`] did.
#[derive(Debug, Clone)]
pub enum Early {
    /// Not sent: the claim is cached or being read, or was prepared meanwhile.
    NotSent,
    /// Read (or tried), not kept: not allocated and reserved yet, or the read failed.
    Read,
    /// Read and kept: allocated and reserved for a pod.
    Kept(Arc<ResourceClaim>),
}

impl Early {
    /// Whether the read was sent.
    pub fn sent(&self) -> bool {
        !matches!(self, Early::NotSent)
    }
}

/// A [`ClaimSource`] that serves claims read early, over the source that reads them.
pub struct Prefetcher {
    source: Arc<dyn ClaimSource>,
    cache: Mutex<Cache>,
    at_once: Semaphore,
}

impl Prefetcher {
    /// Early reads and the kubelet's own go to `source`.
    pub fn new(source: Arc<dyn ClaimSource>) -> Self {
        Self { source, cache: Mutex::default(), at_once: Semaphore::new(AT_ONCE) }
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims in the cache, read or in flight.
    pub fn len(&self) -> usize {
        self.cache().entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `namespace/name` is cached or being read.
    pub fn holds(&self, namespace: &str, name: &str) -> bool {
        self.cache().live(&(namespace.to_string(), name.to_string()), Instant::now()).is_some()
    }

    /// Reads `namespace/name` now unless it is cached or being read: waits for one of
    /// [`AT_ONCE`] places, then reads it within [`EARLY_BUDGET`] if the rate limit has a
    /// token free; an allocated, reserved claim is kept. Returns whether it was read, and
    /// the claim when it was kept.
    pub async fn fetch_early(&self, namespace: &str, name: &str) -> Early {
        let key = (namespace.to_string(), name.to_string());
        if self.cache().live(&key, Instant::now()).is_some() {
            return Early::NotSent;
        }
        // The place is taken before the flight shows, so a prepare never waits for a read
        // that has not started.
        let Ok(_place) = self.at_once.acquire().await else { return Early::NotSent };
        let (seq, tx) = {
            let mut cache = self.cache();
            if cache.live(&key, Instant::now()).is_some() {
                return Early::NotSent;
            }
            cache.fly(key.clone())
        };
        let deadline = crate::kube::backoff::deadline_in(EARLY_BUDGET);
        let mut read = self.source.get_claim_early(namespace, name, deadline).await;
        // The node authorizer learns that a pod bound to this node uses the claim from its
        // own watch, which may lag the pod event that started this read by a few
        // milliseconds: a refusal is tried again shortly (the flight stays, so a prepare
        // arriving meanwhile waits for it rather than reading too).
        for pause in FORBIDDEN_RETRIES {
            match &read {
                Err(e) if e.is_forbidden() => tokio::time::sleep(pause).await,
                _ => break,
            }
            read = self.source.get_claim_early(namespace, name, deadline).await;
        }
        match read {
            Ok(claim) => {
                let claim = Arc::new(claim);
                let kept = cacheable(&claim);
                tracing::debug!(claim.namespace = namespace, claim.name = name, kept, "claim read early");
                self.cache().land(&key, seq, if kept { Landing::Keep(claim.clone()) } else { Landing::Drop });
                tx.send_replace(Some(claim.clone()));
                match kept {
                    true => Early::Kept(claim),
                    false => Early::Read,
                }
            }
            Err(e) => {
                tracing::debug!(claim.namespace = namespace, claim.name = name, error = %crate::util::error_chain(&e), "claim not read early");
                self.cache().land(&key, seq, Landing::Drop);
                Early::Read
            }
        }
    }

    /// Drops what is kept of `namespace/name` (its pod started, ended or went away).
    pub fn forget(&self, namespace: &str, name: &str) {
        self.cache().remove(&(namespace.to_string(), name.to_string()));
    }

    /// `namespace/name` was prepared: the claim kept for it goes, and an early read still
    /// waiting for its turn is not sent.
    fn taken(&self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let mut cache = self.cache();
        if let Some(entry) = cache.entries.get_mut(&key) {
            entry.slot = Slot::Taken { at: Instant::now() };
        }
    }

    /// Claims kept, read and not yet used.
    pub fn kept(&self) -> usize {
        self.cache().entries.values().filter(|e| matches!(e.slot, Slot::Ready { .. })).count()
    }

    /// The kubelet's read of `claim`: the cached claim, the early read in flight, or its own.
    async fn claim_for(&self, claim: &ClaimRef, deadline: Instant) -> Result<ResourceClaim, ClaimFetchError> {
        let key = (claim.namespace.clone(), claim.name.clone());
        let found = {
            let mut cache = self.cache();
            match cache.live(&key, Instant::now()).map(|e| &e.slot) {
                Some(Slot::Ready { claim, .. }) => Found::Cached(claim.clone()),
                Some(Slot::Flying(rx)) => Found::InFlight(rx.clone()),
                Some(Slot::Taken { .. }) | None => {
                    let (seq, tx) = cache.fly(key.clone());
                    Found::Own(seq, tx)
                }
            }
        };
        match found {
            Found::Cached(c) if usable(&c, &claim.uid) => {
                tracing::debug!(claim.uid = %claim.uid, "claim read early; no GET");
                return Ok(ResourceClaim::clone(&c));
            }
            Found::Cached(_) => self.cache().remove(&key),
            Found::InFlight(mut rx) => {
                let waited = tokio::time::timeout_at(deadline, rx.wait_for(Option::is_some)).await;
                if let Ok(Ok(c)) = waited
                    && let Some(c) = c.as_ref()
                    && usable(c, &claim.uid)
                {
                    tracing::debug!(claim.uid = %claim.uid, "claim read early, in flight when asked; no GET");
                    return Ok(ResourceClaim::clone(c));
                }
            }
            Found::Own(seq, _flying) => {
                let read = self.source.get_claim(&claim.namespace, &claim.name, deadline).await;
                self.cache().land(&key, seq, Landing::Taken);
                return read;
            }
        }
        self.source.get_claim(&claim.namespace, &claim.name, deadline).await
    }
}

impl ClaimSource for Prefetcher {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
        deadline: Instant,
    ) -> BoxFuture<'_, Result<ResourceClaim, ClaimFetchError>> {
        self.source.get_claim(namespace, name, deadline)
    }

    fn claim_for<'a>(
        &'a self,
        claim: &'a ClaimRef,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimFetchError>> {
        Box::pin(Prefetcher::claim_for(self, claim, deadline))
    }

    fn prepared(&self, claim: &ClaimRef) {
        self.taken(&claim.namespace, &claim.name);
    }
}

#[cfg(test)]
mod tests;
