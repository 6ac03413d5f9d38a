//! Response bodies in memory: each read whole into one buffer up to its request's limit,
//! and the bytes held at once by bodies of up to one object (claims, nodes, slices, status
//! answers) bounded by a [`BodyBudget`], so a kubelet call that reads many large claims at
//! once cannot hold them all together.
//!
//! The budget has two pools. Before a request is sent it takes [`SMALL_BODY`] from the
//! small pool, which every read may fill without waiting. A body that grows beyond it (or
//! declares more) takes the rest of what it may hold from the large pool, which admits one
//! body of the largest size; if the large pool is busy, the read is given up (its stream
//! closed, holding nothing of HTTP/2's shared window) and sent again once the room is
//! reserved. A read never waits while it holds a stream or part of the large pool, so
//! reads cannot wait on each other in a circle, and pools are always taken small first.
//!
//! When the last large body is dropped the allocator is asked to return free memory
//! ([`crate::malloc::release_free_memory`]), so the resident set falls back after a spike.
//! Lists (up to 64 MiB) are read one at a time by their loops and are not counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Limited};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// What every read may hold without the large pool.
pub const SMALL_BODY: usize = 256 << 10;
/// The bytes bodies of up to one object may hold at once.
pub const BODY_BUDGET: usize = 32 << 20;

/// The bytes held by response bodies, bounded (module doc).
#[derive(Debug)]
pub struct BodyBudget {
    small: Arc<Semaphore>,
    large: Arc<Semaphore>,
    large_size: usize,
    /// The largest body it admits.
    max_body: usize,
    gauge: Arc<Gauge>,
}

/// Bytes in body buffers now and at most so far.
#[derive(Debug, Default)]
struct Gauge {
    held: AtomicUsize,
    peak: AtomicUsize,
}

impl Gauge {
    fn add(&self, n: usize) {
        let now = self.held.fetch_add(n, Ordering::SeqCst).saturating_add(n);
        self.peak.fetch_max(now, Ordering::SeqCst);
    }

    fn sub(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::SeqCst);
    }
}

fn permits(bytes: usize) -> u32 {
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

impl BodyBudget {
    /// A budget of `total` bytes that admits one body of `max_body` (which takes half or
    /// more of it; the small pool gets the rest, at least [`SMALL_BODY`]).
    pub fn new(total: usize, max_body: usize) -> Self {
        let large_size = max_body.saturating_sub(SMALL_BODY).max(total / 2);
        let small_size = total.saturating_sub(large_size).max(SMALL_BODY);
        BodyBudget {
            small: Arc::new(Semaphore::new(small_size)),
            large: Arc::new(Semaphore::new(large_size)),
            large_size,
            max_body,
            gauge: Arc::default(),
        }
    }

    /// Bytes in body buffers now.
    pub fn held(&self) -> usize {
        self.gauge.held.load(Ordering::SeqCst)
    }

    /// The most bytes body buffers held at once so far.
    pub fn peak(&self) -> usize {
        self.gauge.peak.load(Ordering::SeqCst)
    }

    /// Whether reads limited to `limit` bytes are counted (lists are not).
    pub fn covers(&self, limit: usize) -> bool {
        limit <= self.max_body
    }

    /// [`BodyBudget::room`] by `until` (none when that passes first); a read of more
    /// than the budget covers (a list) is not counted.
    pub(super) async fn room_by(&self, limit: usize, large: bool, until: Option<Instant>) -> Option<Room> {
        if !self.covers(limit) {
            return Some(Room::uncounted());
        }
        match until {
            None => Some(self.room(limit, large).await),
            Some(at) => tokio::time::timeout_at(at, self.room(limit, large)).await.ok(),
        }
    }

    /// Room for a read before its request is sent: [`SMALL_BODY`], and with `large` the
    /// rest of `limit` too (a read sent again after it found the large pool busy).
    pub async fn room(&self, limit: usize, large: bool) -> Room {
        let small = self.small.clone().acquire_many_owned(permits(SMALL_BODY)).await.ok();
        let mut room = Room { small, large: None, budget: Some(self.handle()), bytes: SMALL_BODY };
        if large {
            let rest = limit.saturating_sub(SMALL_BODY).min(self.large_size);
            room.large = self.large.clone().acquire_many_owned(permits(rest)).await.ok();
            room.bytes = room.bytes.saturating_add(rest);
        }
        room
    }

    fn handle(&self) -> Handle {
        Handle { large: self.large.clone(), large_size: self.large_size, gauge: self.gauge.clone() }
    }
}

/// What a [`Room`] needs of its budget after the read.
#[derive(Debug)]
struct Handle {
    large: Arc<Semaphore>,
    large_size: usize,
    gauge: Arc<Gauge>,
}

/// Room reserved for one body; returned to the budget when the body is dropped.
#[derive(Debug)]
pub struct Room {
    small: Option<OwnedSemaphorePermit>,
    large: Option<OwnedSemaphorePermit>,
    budget: Option<Handle>,
    /// The bytes it may hold.
    bytes: usize,
}

impl Room {
    /// Room for a read the budget does not count.
    pub fn uncounted() -> Room {
        Room { small: None, large: None, budget: None, bytes: usize::MAX }
    }

    /// Makes room for `len` bytes of a body of at most `most`, from the large pool only if
    /// it is free now; false when the read must be sent again with the room reserved.
    fn fit(&mut self, len: usize, most: usize) -> bool {
        if len <= self.bytes {
            return true;
        }
        let Some(h) = &self.budget else { return true };
        if self.large.is_some() {
            return false;
        }
        let rest = most.saturating_sub(SMALL_BODY).min(h.large_size);
        match h.large.clone().try_acquire_many_owned(permits(rest)) {
            Ok(p) => {
                self.large = Some(p);
                self.bytes = SMALL_BODY.saturating_add(rest);
                len <= self.bytes
            }
            Err(_) => false,
        }
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        let was_large = self.large.take().is_some();
        self.small.take();
        if let Some(h) = &self.budget
            && was_large
            && h.large.available_permits() >= h.large_size
        {
            crate::malloc::release_free_memory();
        }
    }
}

/// A body's bytes with the room they hold; the room goes back when the bytes are dropped.
struct Held {
    data: BytesMut,
    gauge: Option<Arc<Gauge>>,
    room: Room,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(g) = &self.gauge {
            g.sub(self.data.len());
        }
        // The buffer goes before the room, so the memory returned after a spike includes it.
        self.data = BytesMut::new();
    }
}

/// Why a body could not be read.
#[derive(Debug)]
pub(super) enum ReadError {
    /// The body outgrew its room and the large pool is busy: send the read again with
    /// [`BodyBudget::room`]`(limit, true)`.
    Crowded,
    /// Longer than the limit ([`http_body_util::LengthLimitError`]) or a broken stream.
    Body(Box<dyn std::error::Error + Send + Sync>),
}

/// A body's data in one buffer, each frame copied in as it arrives and then dropped: the
/// body is held once, not as its frames and their concatenation. `declared` (the
/// Content-Length, already checked against the limit) sizes the buffer up front.
pub(super) async fn collect<B>(
    mut body: Limited<B>,
    declared: Option<u64>,
    limit: usize,
    mut room: Room,
) -> Result<Bytes, ReadError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let declared = declared.and_then(|n| usize::try_from(n).ok());
    let most = declared.unwrap_or(limit);
    if declared.is_some_and(|n| !room.fit(n, most)) {
        return Err(ReadError::Crowded);
    }
    let gauge = room.budget.as_ref().map(|h| h.gauge.clone());
    let mut held = Held { data: BytesMut::with_capacity(declared.unwrap_or(0)), gauge, room };
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(ReadError::Body)?.into_data() else { continue };
        if !held.room.fit(held.data.len().saturating_add(data.len()), most) {
            return Err(ReadError::Crowded);
        }
        if let Some(g) = &held.gauge {
            g.add(data.len());
        }
        held.data.extend_from_slice(&data);
    }
    Ok(Bytes::from_owner(held))
}
