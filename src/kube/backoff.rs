//! Time policies of the client: a token-bucket rate limiter (waits, or refuses a request
//! its deadline would not let wait), a jittered exponential backoff, and overflow-free
//! deadlines. All run on tokio time so tests use paused time.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// `now + d`, or a point decades away when that does not fit in an `Instant` (a duration
/// from configuration or from the server must never overflow the clock).
pub fn deadline_in(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d).unwrap_or_else(|| now + FAR_FUTURE)
}

/// What [`deadline_in`] gives for durations too long for the clock: about 30 years.
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 86_400);

/// A token bucket: `burst` tokens, refilled at `qps` per second. Each request reserves the
/// next token, which may lie in the future (the bucket goes negative: requests queued ahead),
/// and sleeps until then, so waiters are served in order without holding a lock. A request
/// with a deadline its token would miss is refused at once ([`Throttled`]) and reserves
/// nothing: it neither waits in vain nor delays the requests behind it.
#[derive(Debug)]
pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// The rate limit would hold a request past its deadline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throttled {
    /// How long the request would have waited for its token.
    pub wait: Duration,
    /// Requests holding tokens ahead of it.
    pub queued: u64,
}

impl RateLimiter {
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        let qps = if qps.is_finite() && qps > 0.0 { qps } else { f64::MAX };
        RateLimiter { qps, burst, state: Mutex::new(Bucket { tokens: burst, last: Instant::now() }) }
    }

    /// Reserve a token usable at the returned instant, unless that is after `deadline`.
    pub fn reserve(&self, deadline: Option<Instant>) -> Result<Instant, Throttled> {
        let mut b = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        b.tokens = (b.tokens + now.duration_since(b.last).as_secs_f64() * self.qps).min(self.burst);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(now);
        }
        // Configuration bounds qps, but a wait that does not fit a Duration or the clock
        // must still not panic: it becomes "decades".
        let wait = Duration::try_from_secs_f64((1.0 - b.tokens) / self.qps).unwrap_or(FAR_FUTURE);
        let at = now.checked_add(wait);
        if let Some(deadline) = deadline
            && at.is_none_or(|at| at > deadline)
        {
            // A float-to-integer `as` saturates; the count is for the message only.
            let queued = (-b.tokens).ceil().max(0.0) as u64;
            return Err(Throttled { wait, queued });
        }
        b.tokens -= 1.0;
        Ok(at.unwrap_or_else(|| now + FAR_FUTURE))
    }

    /// Take one token, waiting until one is available.
    pub async fn acquire(&self) {
        if let Ok(at) = self.reserve(None) {
            wait_for_token(at).await;
        }
    }

    /// Take one token if it is available by `deadline` (then wait for it), else refuse.
    pub async fn acquire_by(&self, deadline: Instant) -> Result<(), Throttled> {
        let at = self.reserve(Some(deadline))?;
        wait_for_token(at).await;
        Ok(())
    }

    /// The configured rate and burst.
    pub fn limits(&self) -> (f64, f64) {
        (self.qps, self.burst)
    }
}

/// Waits until a token reserved for `at` is due. A token free now is taken at once: a
/// sleep until now would wait for the timer's next tick (Tokio's timer counts whole
/// milliseconds, rounding up), which made every request wait up to a millisecond more.
async fn wait_for_token(at: Instant) {
    if at > Instant::now() {
        tokio::time::sleep_until(at).await;
    }
}

/// Exponential backoff with full jitter: the n-th delay is uniform in
/// `[base·2ⁿ / 2, base·2ⁿ]`, capped at `max`. `reset` starts over after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff { base, max, attempt: 0 }
    }

    /// The next delay (and count one more attempt).
    pub fn next_delay(&mut self) -> Duration {
        let exp = self.base.saturating_mul(1u32 << self.attempt.min(20)).min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = exp / 2;
        half + half.mul_f64(fastrand::f64())
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Attempts since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests;
