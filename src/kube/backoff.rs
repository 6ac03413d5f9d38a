//! Time policies of the client: a token-bucket rate limiter (waits, never fails) and a
//! jittered exponential backoff. Both run on tokio time so tests use paused time.

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// A token bucket: `burst` tokens, refilled at `qps` per second. `acquire` waits for a
/// token; waiters are served in order (the lock is held while waiting).
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

impl RateLimiter {
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        let qps = if qps.is_finite() && qps > 0.0 { qps } else { f64::MAX };
        RateLimiter { qps, burst, state: Mutex::new(Bucket { tokens: burst, last: Instant::now() }) }
    }

    /// Take one token, waiting until one is available.
    pub async fn acquire(&self) {
        let mut b = self.state.lock().await;
        let now = Instant::now();
        b.tokens = (b.tokens + now.duration_since(b.last).as_secs_f64() * self.qps).min(self.burst);
        b.last = now;
        if b.tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - b.tokens) / self.qps);
            tokio::time::sleep(wait).await;
            b.tokens = 1.0;
            b.last = now + wait;
        }
        b.tokens -= 1.0;
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
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_is_immediate_then_paced_at_qps() {
        let rl = RateLimiter::new(10.0, 3);
        let start = Instant::now();
        for _ in 0..3 {
            rl.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst must not wait");
        for _ in 0..5 {
            rl.acquire().await;
        }
        let e = start.elapsed();
        assert!(e >= Duration::from_millis(500) && e < Duration::from_millis(520), "5 more at 10 qps took {e:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_refills_while_idle_up_to_burst() {
        let rl = RateLimiter::new(2.0, 2);
        rl.acquire().await;
        rl.acquire().await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        let start = Instant::now();
        rl.acquire().await;
        rl.acquire().await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        rl.acquire().await;
        assert_eq!(start.elapsed(), Duration::from_millis(500), "only `burst` tokens accumulate");
    }

    #[test]
    fn backoff_grows_is_jittered_capped_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        let mut prev_max = Duration::ZERO;
        for n in 0..12u32 {
            let d = b.next_delay();
            let exp = Duration::from_millis(100).saturating_mul(1 << n).min(Duration::from_secs(30));
            assert!(d >= exp / 2 && d <= exp, "attempt {n}: {d:?} outside [{:?}, {exp:?}]", exp / 2);
            assert!(exp >= prev_max);
            prev_max = exp;
        }
        assert_eq!(prev_max, Duration::from_secs(30));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
