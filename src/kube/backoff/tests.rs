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

#[test]
fn a_free_token_is_taken_without_the_timer() {
    // A runtime without a timer: a sleep, even until now, would panic here.
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    let rl = RateLimiter::new(1.0, 3);
    rt.block_on(async {
        rl.acquire().await;
        rl.acquire_by(Instant::now() + Duration::from_secs(1)).await.expect("a free token");
        rl.acquire().await;
    });
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

#[tokio::test(start_paused = true)]
async fn a_token_beyond_the_deadline_is_refused_without_being_taken() {
    let rl = RateLimiter::new(1.0, 2);
    let start = Instant::now();
    rl.acquire().await;
    rl.acquire().await;
    // Two requests queue behind the empty bucket: tokens at +1 s and +2 s.
    assert_eq!(rl.reserve(None), Ok(start + Duration::from_secs(1)));
    assert_eq!(rl.reserve(None), Ok(start + Duration::from_secs(2)));
    let refused = rl.reserve(Some(start + Duration::from_millis(2500))).unwrap_err();
    assert_eq!(refused, Throttled { wait: Duration::from_secs(3), queued: 2 });
    // The refusal took nothing: the next token is still at +3 s.
    assert_eq!(rl.reserve(Some(start + Duration::from_secs(3))), Ok(start + Duration::from_secs(3)));
}

#[tokio::test(start_paused = true)]
async fn absurd_rates_do_not_panic() {
    // 1e-300 requests per second: the second token is further away than a Duration holds.
    let rl = RateLimiter::new(1e-300, 1);
    rl.acquire().await;
    let far = rl.reserve(None).expect("no deadline, no refusal");
    assert!(far > Instant::now() + Duration::from_secs(365 * 86_400));
    let refused = rl.reserve(Some(Instant::now() + Duration::from_secs(60))).unwrap_err();
    assert!(refused.wait > Duration::from_secs(365 * 86_400));
    assert!(deadline_in(Duration::MAX) > Instant::now() + Duration::from_secs(365 * 86_400));
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
