//! The release binary as a child process (`target/release/edra run`, mock backend, node
//! credentials, the test API server on loopback HTTPS): start-up to registered and
//! published, idle memory, memory after 10,000 prepare/unprepare cycles, prepare latency of
//! the shipped binary, the peak and what stays of one call for 16 claims of almost 16 MiB, binary size and dynamic libraries. `cargo bench` rebuilds
//! `target/release/edra` with the bench profile, so: `cargo build --release && cp
//! target/release/edra target/edra.release && BENCH_BINARY=target/edra.release cargo bench
//! --bench footprint`.
//!
//! For profiling runs: `BENCH_CYCLES=n` (measured cycles), `BENCH_PROFILE=1` (accept a binary
//! with symbols, or a wrapper script running heaptrack or strace), `BENCH_HOLD=s` (keep the
//! agent idle that long before stopping it). docs/benchmarks.md has the recipes.

#[allow(unused_imports)]
#[path = "../tests/it/support/mod.rs"]
mod support;

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Samples, Site, SiteSettings, latency_header, release_binary};
use edra::plugin::proto::dra_v1 as v1;
use support::apiserver::Options;
use support::procfs::{Mapping, malloc_arena_heaps, smaps, status as proc_status};

const GPUS: usize = 8;
/// Measured cycles; `BENCH_CYCLES` overrides (e.g. shorter runs under a heap profiler).
const DEFAULT_CYCLES: usize = 10_000;
const WARMUP_CYCLES: usize = 200;
const SETTLE: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() {
    let bin = release_binary();
    let Ok(meta) = std::fs::metadata(&bin) else {
        eprintln!("{} is missing: run `cargo build --release` first (see docs/benchmarks.md)", bin.display());
        std::process::exit(1);
    };
    let cycles = std::env::var("BENCH_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_CYCLES);
    // `BENCH_PROFILE=1` accepts a binary with symbols or a wrapper script (heaptrack, strace):
    // the memory figures are then the profiler's, not the shipped binary's.
    let profiling = std::env::var_os("BENCH_PROFILE").is_some();
    if !profiling && common::has_symbol_table(&bin) {
        eprintln!(
            "{} is not the stripped release build (cargo bench rebuilds target/release/edra with the bench \
             profile): `cargo build --release && cp target/release/edra target/edra.release`, then run with \
             BENCH_BINARY=target/edra.release",
            bin.display()
        );
        std::process::exit(1);
    }
    println!("# edra footprint benchmark (release binary as a child process)\n");
    println!("## Binary\n");
    println!("{}: {} bytes ({:.2} MiB), stripped\n", bin.display(), meta.len(), meta.len() as f64 / 1048576.0);
    match Command::new("ldd").arg(&bin).output() {
        Ok(out) => println!("ldd:\n```\n{}```\n", String::from_utf8_lossy(&out.stdout)),
        Err(e) => println!("ldd not available: {e}\n"),
    }

    // Log level info: what a node runs by default.
    let settings = SiteSettings { gpus: GPUS as u32, log_level: "info", ..SiteSettings::default() };
    let site = Site::new(Options::default(), settings).await;
    println!("Layout: {}\n", site.layout_note);
    let start = Instant::now();
    let mut child = common::spawn_release(&site);
    let pid = child.id();
    while !site.registration_socket().exists() {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(site.dir.path().join("edra.log")).unwrap_or_default();
            panic!("edra exited ({status}) before serving the kubelet:\n{log}");
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no registration socket after 30 s");
        // The start-up figures have this resolution.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let socket_at = start.elapsed();
    common::register(&site.registration_socket()).await;
    let registered_at = start.elapsed();
    site.wait_published(GPUS, Duration::from_secs(30)).await;
    let published_at = start.elapsed();
    println!("## Start-up (exec → ...)\n");
    println!("| milestone | ms |\n|---|---:|");
    println!("| registration socket exists | {:.1} |", socket_at.as_secs_f64() * 1e3);
    println!("| registered (GetInfo + NotifyRegistrationStatus answered) | {:.1} |", registered_at.as_secs_f64() * 1e3);
    println!("| {GPUS} devices published | {:.1} |\n", published_at.as_secs_f64() * 1e3);

    tokio::time::sleep(SETTLE).await;
    let idle = proc_status(pid);
    let idle_maps = largest_mappings(&smaps(pid), 8);
    let cpu_idle_start = cpu_ticks(pid);
    let mark = site.server.request_mark();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_ticks = cpu_ticks(pid) - cpu_idle_start;
    let idle_requests = site.server.request_mark() - mark;

    let mut client = support::kubelet::dra_v1(&site.dra_socket()).await;
    let (mut prep, mut release) = (Samples::default(), Samples::default());
    let mut warm = None;
    let mut warm_maps = Vec::new();
    let mut trend = Vec::new();
    for i in 0..(WARMUP_CYCLES + cycles) {
        let claim = site.claim(&format!("c{i}"), &[format!("gpu-{}", i % GPUS)]);
        let t = Instant::now();
        let answer = client
            .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![claim.clone()] })
            .await
            .expect("NodePrepareResources")
            .into_inner();
        let p = t.elapsed();
        let r = answer.claims.get(&claim.uid).expect("an answer for the claim");
        assert!(r.error.is_empty(), "prepare failed: {}", r.error);
        let t = Instant::now();
        let answer = client
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![claim.clone()] })
            .await
            .expect("NodeUnprepareResources")
            .into_inner();
        let u = t.elapsed();
        let r = answer.claims.get(&claim.uid).expect("an answer for the claim");
        assert!(r.error.is_empty(), "unprepare failed: {}", r.error);
        // Keep the test server's memory flat too: it is not what is measured.
        site.server.delete_claim(common::NAMESPACE, &format!("c{i}"));
        if i + 1 == WARMUP_CYCLES {
            warm = Some(proc_status(pid));
            warm_maps = anon_mappings(&smaps(pid));
        }
        if (i + 1) % (cycles / 10).max(1) == 0 || i + 1 == WARMUP_CYCLES {
            let now = proc_status(pid);
            let maps = smaps(pid);
            trend.push((
                i + 1,
                get(&now, "VmRSS"),
                get(&now, "RssAnon"),
                get(&now, "Threads"),
                malloc_arena_heaps(&maps),
                anon_by_mapping(&maps),
            ));
        }
        if i >= WARMUP_CYCLES {
            prep.push(p);
            release.push(u);
        }
    }
    tokio::time::sleep(SETTLE).await;
    let after = proc_status(pid);
    let warm = warm.unwrap_or_default();

    println!("## Memory (KiB, /proc/<pid>/status)\n");
    println!(
        "| field | idle ({}s after published) | after {WARMUP_CYCLES} cycles | after {} cycles | growth over the last {cycles} |",
        SETTLE.as_secs(),
        WARMUP_CYCLES + cycles
    );
    println!("|---|---:|---:|---:|---:|");
    for field in ["VmRSS", "VmHWM", "RssAnon", "RssFile", "VmData", "Threads"] {
        let (a, b, c) = (get(&idle, field), get(&warm, field), get(&after, field));
        println!("| {field} | {a} | {b} | {c} | {:+} |", c as i64 - b as i64);
    }
    println!();
    println!(
        "VmRSS / RssAnon (KiB) as the cycles go, and where the anonymous pages are (smaps):\n\n\
         | cycles | VmRSS | RssAnon | threads | malloc arenas besides the main one | [heap] | anonymous mappings | file mappings (relocated data) | [stack], [vdso] |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (n, rss, anon, threads, arenas, (heap, maps, file, stacks)) in &trend {
        println!("| {n} | {rss} | {anon} | {threads} | {arenas} | {heap} | {maps} | {file} | {stacks} |");
    }
    println!();
    println!(
        "anonymous mappings that changed between {WARMUP_CYCLES} cycles and the end (KiB; Size, Anonymous):\n\n\
         | mapping | perms | size before | size after | anon before | anon after |\n|---|---|---:|---:|---:|---:|"
    );
    let end_maps = anon_mappings(&smaps(pid));
    for (range, perms, size, anon) in &end_maps {
        let before = warm_maps.iter().find(|m| &m.0 == range);
        let (bsize, banon) = before.map(|m| (m.2, m.3)).unwrap_or((0, 0));
        if before.is_none() || banon != *anon {
            println!("| {range} | {perms} | {bsize} | {size} | {banon} | {anon} |");
        }
    }
    for (range, perms, size, anon) in &warm_maps {
        if !end_maps.iter().any(|m| &m.0 == range) {
            println!("| {range} (gone) | {perms} | {size} | 0 | {anon} | 0 |");
        }
    }
    println!();
    println!(
        "largest mappings at idle (KiB resident, from /proc/<pid>/smaps):\n\n| Rss | Size | mapping |\n|---:|---:|---|"
    );
    for (rss, size, name) in idle_maps {
        println!("| {rss} | {size} | {name} |");
    }
    println!();
    println!(
        "idle for 10 s: {} API requests, CPU {:.2} s user+system\n",
        idle_requests,
        idle_ticks as f64 / clock_ticks() as f64
    );
    println!(
        "## Latency of the release binary ({cycles} cycles, one claim per call, after {WARMUP_CYCLES} warm-up cycles, log level info)\n"
    );
    println!("{}", latency_header());
    println!("{}", prep.row("prepare"));
    println!("{}", release.row("unprepare"));
    println!();

    large_claims_in_one_call(&site, &mut client, pid).await;

    // `BENCH_HOLD=<seconds>`: keep the agent idle before stopping it, e.g. to attach a debugger.
    if let Some(hold) = std::env::var("BENCH_HOLD").ok().and_then(|v| v.parse().ok()) {
        eprintln!("holding edra (pid {pid}) for {hold} s");
        tokio::time::sleep(Duration::from_secs(hold)).await;
    }
    // SIGTERM: shut down within the grace period and remove the sockets.
    let t = Instant::now();
    // SAFETY: kill(2) with our own child's pid and a valid signal number.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().expect("wait for edra");
    println!(
        "SIGTERM → exit: {:.1} ms ({status}); sockets removed: {}\n",
        t.elapsed().as_secs_f64() * 1e3,
        !site.registration_socket().exists() && !site.dra_socket().exists()
    );
}

/// Claims in the one kubelet call of [`large_claims_in_one_call`], and each one's size.
const LARGE_CLAIMS: usize = 16;
const LARGE_CLAIM_BYTES: usize = (16 << 20) - (64 << 10);

/// One NodePrepareResources call for 16 claims of almost 16 MiB each (the most one object
/// may be): VmHWM and VmRSS before, right after, and a minute later, then the claims go.
async fn large_claims_in_one_call(
    site: &Site,
    client: &mut v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
    pid: u32,
) {
    let claims: Vec<v1::Claim> = (0..LARGE_CLAIMS)
        .map(|i| site.large_claim(&format!("large{i}"), &format!("gpu-{}", i % GPUS), LARGE_CLAIM_BYTES))
        .collect();
    let before = proc_status(pid);
    let t = Instant::now();
    let answer = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: claims.clone() })
        .await
        .expect("NodePrepareResources")
        .into_inner();
    let took = t.elapsed();
    let prepared: Vec<&v1::Claim> =
        claims.iter().filter(|c| answer.claims.get(&c.uid).is_some_and(|r| r.error.is_empty())).collect();
    let right_after = proc_status(pid);
    let refused = answer.claims.values().find(|r| !r.error.is_empty()).map(|r| r.error.clone());
    tokio::time::sleep(Duration::from_secs(60)).await;
    let later = proc_status(pid);
    println!(
        "## {LARGE_CLAIMS} claims of {:.1} MiB in one call (KiB)\n\n{} prepared, {:.2} s\n",
        LARGE_CLAIM_BYTES as f64 / 1048576.0,
        prepared.len(),
        took.as_secs_f64()
    );
    if let Some(e) = refused {
        println!("one refused: {e}\n");
    }
    println!("| field | before | right after | a minute later |\n|---|---:|---:|---:|");
    for field in ["VmHWM", "VmRSS", "RssAnon"] {
        println!("| {field} | {} | {} | {} |", get(&before, field), get(&right_after, field), get(&later, field));
    }
    println!();
    let release = prepared.into_iter().cloned().collect();
    client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: release })
        .await
        .expect("NodeUnprepareResources");
    for i in 0..LARGE_CLAIMS {
        site.server.delete_claim(common::NAMESPACE, &format!("large{i}"));
    }
}

/// The `n` mappings with the most resident memory: (Rss KiB, Size KiB, what).
fn largest_mappings(maps: &[Mapping], n: usize) -> Vec<(u64, u64, String)> {
    let mut out: Vec<_> = maps
        .iter()
        .map(|m| (m.rss, m.size, format!("{} {}", m.range(), if m.name.is_empty() { "[anon]" } else { &m.name })))
        .collect();
    out.sort_by_key(|m| std::cmp::Reverse(m.0));
    out.truncate(n);
    out
}

/// Unnamed mappings: (address range, permissions, Size KiB, Anonymous KiB).
fn anon_mappings(maps: &[Mapping]) -> Vec<(String, String, u64, u64)> {
    maps.iter().filter(|m| m.name.is_empty()).map(|m| (m.range(), m.perms.clone(), m.size, m.anonymous)).collect()
}

/// Anonymous KiB by kind of mapping: ([heap], unnamed mappings (malloc arenas, large
/// allocations, thread stacks), file mappings, the named ones ([stack], [vdso]).
fn anon_by_mapping(maps: &[Mapping]) -> (u64, u64, u64, u64) {
    let (mut heap, mut unnamed, mut file, mut stacks) = (0, 0, 0, 0);
    for m in maps {
        match m.name.as_str() {
            "[heap]" => heap += m.anonymous,
            "" => unnamed += m.anonymous,
            n if n.starts_with('[') => stacks += m.anonymous,
            _ => file += m.anonymous,
        }
    }
    (heap, unnamed, file, stacks)
}

fn get(m: &std::collections::BTreeMap<String, u64>, k: &str) -> u64 {
    m.get(k).copied().unwrap_or(0)
}

/// utime + stime of `pid` in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    n(11) + n(12)
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}
