//! Prepare and unprepare latency through the kubelet's gRPC API on the real Unix socket,
//! with the agent (`edra::app::run`) in-process on its own two-thread runtime and the test
//! API server on loopback HTTPS. Prints tables; `cargo bench --bench prepare`.

#[allow(unused_imports)]
#[path = "../tests/it/support/mod.rs"]
mod support;

mod common;

use std::time::{Duration, Instant};

use common::phases::{Phases, Steps};
use common::{InProcessAgent, Layout, Samples, Site, SiteSettings, latency_header, ms};
use edra::plugin::proto::dra_v1 as v1;
use edra::plugin::proto::dra_v1::dra_plugin_client::DraPluginClient;
use edra::prepare::cdi;
use edra::state::{ClaimRecord, DeviceRecord, Phase, SCHEMA_VERSION, Store};
use support::apiserver::Options;
use tonic::transport::Channel;

/// Claims measured one per call (each a distinct claim, prepared then unprepared).
const SINGLE: usize = 1000;
/// Claims per call in the batch measurement, and how many such calls.
const BATCH: usize = 32;
const BATCH_CALLS: usize = 50;
const WARMUP: usize = 40;

#[tokio::main]
async fn main() {
    println!("# edra prepare benchmark (agent in-process, gRPC over a Unix socket, API server on loopback HTTPS)\n");
    // One part when its name is given (`cargo bench --bench prepare -- mig`), else all.
    const PARTS: [&str; 7] = ["timeslicing", "mps", "shares", "mig", "prefetch", "bursts", "single"];
    let args: Vec<String> = std::env::args().collect();
    match PARTS.into_iter().find(|p| args.iter().any(|a| a == p)) {
        Some("timeslicing") => return time_slicing().await,
        Some("mps") => return mps().await,
        Some("shares") => return shares().await,
        Some("mig") => return mig().await,
        Some("prefetch") => return pod_starts_table().await,
        Some("bursts") => return bursts().await,
        Some(_) => {
            drop(single(8, Layout::Production).await);
            burst().await;
            return pod_starts_table().await;
        }
        None => {}
    }
    let sample = single(8, Layout::Production).await;
    let same_disk = single(8, Layout::SameDisk).await;
    drop(same_disk);
    batch().await;
    burst().await;
    pod_starts_table().await;
    time_slicing().await;
    mps().await;
    shares().await;
    mig().await;
    breakdown(sample).await;
}

/// MIG devices prepared in the MIG section.
const MIG_CLAIMS: usize = 300;

/// Dynamic MIG devices on the mock backend in MIG mode (8 A100 80GB): prepare records the
/// intent (PrepareStarted, durable), creates the instance (the mock's state file: read,
/// atomic write with fsync, directory fsync), records its IDs (durable), writes the spec
/// and records PrepareCompleted; unprepare records the release (durable), destroys the
/// instance (another state file write) and removes the record. A real GPU's create and
/// destroy take far longer than the mock's file; the rows below the calls are the mock
/// alone, so the difference is edra's overhead.
async fn mig() {
    let settings = SiteSettings { gpus: 8, rate_limit: UNLIMITED, mig_mode: true, ..SiteSettings::default() };
    let site = Site::new(Options::default(), settings).await;
    let agent = InProcessAgent::start(site.config.clone()).await;
    common::register(&site.registration_socket()).await;
    let mut client = support::kubelet::dra_v1(&site.dra_socket()).await;
    let warmup = 16;
    let (mut prep, mut repeat, mut release) = (Samples::default(), Samples::default(), Samples::default());
    for k in 0..(warmup + MIG_CLAIMS) {
        let device = format!("gpu-{}-mig-3g40gb-9-{}", k % 8, 4 * ((k / 8) % 2));
        let claim = site.claim(&format!("mig{k}"), &[device]);
        let p = prepare(&mut client, vec![claim.clone()]).await;
        let r = prepare(&mut client, vec![claim.clone()]).await;
        let u = unprepare(&mut client, vec![claim]).await;
        if k >= warmup {
            prep.push(p);
            repeat.push(r);
            release.push(u);
        }
    }
    agent.stop();
    // The mock's create and destroy alone, on the same state file.
    let backend = edra::inventory::mock::MockBackend::new(&site.config);
    let inventory = edra::inventory::DeviceBackend::discover(&backend).expect("discover");
    assert!(inventory.devices.is_empty(), "every MIG instance was destroyed");
    let gpu = &inventory.mig_gpus[0];
    let profile = gpu.capability.profile(9).expect("3g.40gb").clone();
    let control = backend.mig_control().expect("MIG mode");
    let (mut create, mut destroy) = (Samples::default(), Samples::default());
    for k in 0..MIG_CLAIMS {
        let placement = profile.placements[k % 2];
        let t = Instant::now();
        let i =
            edra::gpu::mig_control::MigControl::create_mig(control, &gpu.uuid, &profile, placement).expect("create");
        create.push(t.elapsed());
        let t = Instant::now();
        edra::gpu::mig_control::MigControl::destroy_mig(control, &gpu.uuid, i.gi, i.ci).expect("destroy");
        destroy.push(t.elapsed());
    }
    println!(
        "## Dynamic MIG ({MIG_CLAIMS} claims of one 3g.40gb device, each prepared, prepared again, unprepared; mock \
         backend in MIG mode, 8 A100 80GB; {}; rate limit lifted)\n",
        site.layout_note
    );
    println!("{}", latency_header());
    println!("{}", prep.row("prepare, MIG device (create)"));
    println!("{}", repeat.row("prepare again (from state)"));
    println!("{}", release.row("unprepare, MIG device (destroy)"));
    println!("{}", create.row("  mock create alone (state file)"));
    println!("{}", destroy.row("  mock destroy alone (state file)"));
    println!();
    mig_nvml().await;
}

/// The same through the NVML backend: the real nvml-wrapper and raw NVML calls against the
/// NVML stand-in library (one A100 80GB in MIG mode; its instances in the stand-in's state
/// file), next to the stand-in's create and destroy alone.
async fn mig_nvml() {
    let stub = support::nvml::StubNvml::new(&support::nvml::a100(0, 0, "00000000:3B:00.0", true));
    let settings = SiteSettings { gpus: 1, rate_limit: UNLIMITED, mig_mode: true, ..SiteSettings::default() };
    let site = Site::new(Options::default(), settings).await;
    let mut config = site.config.clone();
    // The library is a path under the driver root, beside the stand-in's configuration.
    let dir = config.paths.driver_root.join("nvml");
    std::fs::create_dir_all(&dir).expect("the stand-in's directory");
    std::fs::copy(&stub.library, dir.join("libnvidia-ml.so.1")).expect("copy the stand-in");
    std::fs::copy(stub.dir.path().join("nvml_stub.conf"), dir.join("nvml_stub.conf")).expect("copy its configuration");
    config.backend = edra::config::BackendKind::Nvml;
    config.nvml.library = "/nvml/libnvidia-ml.so.1".into();
    let agent = InProcessAgent::start(config.clone()).await;
    common::register(&site.registration_socket()).await;
    let mut client = support::kubelet::dra_v1(&site.dra_socket()).await;
    let warmup = 16;
    let (mut prep, mut release) = (Samples::default(), Samples::default());
    for k in 0..(warmup + MIG_CLAIMS) {
        let device = format!("gpu-0-mig-3g40gb-9-{}", 4 * (k % 2));
        let claim = site.claim(&format!("nvmlmig{k}"), &[device]);
        let p = prepare(&mut client, vec![claim.clone()]).await;
        let u = unprepare(&mut client, vec![claim]).await;
        if k >= warmup {
            prep.push(p);
            release.push(u);
        }
    }
    agent.stop();
    let backend = edra::inventory::nvml::NvmlBackend::load(&config).expect("load the stand-in");
    let inventory = edra::inventory::DeviceBackend::discover(&backend).expect("discover");
    let gpu = &inventory.mig_gpus[0];
    assert!(gpu.instances.is_empty(), "every MIG instance was destroyed");
    let profile = gpu.capability.profile(9).expect("3g.40gb").clone();
    let (mut create, mut destroy) = (Samples::default(), Samples::default());
    for k in 0..MIG_CLAIMS {
        let placement = profile.placements[k % 2];
        let t = Instant::now();
        let i =
            edra::gpu::mig_control::MigControl::create_mig(&backend, &gpu.uuid, &profile, placement).expect("create");
        create.push(t.elapsed());
        let t = Instant::now();
        edra::gpu::mig_control::MigControl::destroy_mig(&backend, &gpu.uuid, i.gi, i.ci).expect("destroy");
        destroy.push(t.elapsed());
    }
    println!(
        "## Dynamic MIG through NVML ({MIG_CLAIMS} claims of one 3g.40gb device, prepared and unprepared; NVML \
         backend on the NVML stand-in library, one A100 80GB in MIG mode; {}; rate limit lifted)\n",
        site.layout_note
    );
    println!("{}", latency_header());
    println!("{}", prep.row("prepare, MIG device (create)"));
    println!("{}", release.row("unprepare, MIG device (destroy)"));
    println!("{}", create.row("  stand-in create alone (NVML calls)"));
    println!("{}", destroy.row("  stand-in destroy alone (NVML calls)"));
    println!();
}

/// Claims measured in the shares section.
const SHARED: usize = 300;

/// Shares of a GPU next to whole GPUs: a share's prepare adds the accounting of the GPU's
/// shares to the state transaction (read, check, rewrite the GPU's list) and a CDI device
/// named by its share ID; it changes nothing on the GPU. Interleaved with whole-GPU claims
/// (no share ID) on the same GPUs, four shares held on each GPU meanwhile.
async fn shares() {
    let (site, agent, mut client) = ready_site(8, UNLIMITED, Layout::Production).await;
    let mut held = Vec::new();
    for g in 0..4 {
        for k in 0..4 {
            let c = site.claim_share(&format!("held{g}-{k}"), &format!("gpu-{g}"), "10Gi");
            prepare(&mut client, vec![c.clone()]).await;
            held.push(c);
        }
    }
    let (mut sh_prep, mut sh_release) = (Samples::default(), Samples::default());
    let (mut ex_prep, mut ex_release) = (Samples::default(), Samples::default());
    for k in 0..(WARMUP + SHARED) {
        let share = site.claim_share(&format!("sh{k}"), &format!("gpu-{}", k % 4), "20Gi");
        let whole = site.claim(&format!("wh{k}"), &[format!("gpu-{}", 4 + k % 4)]);
        let (p, u) = (prepare(&mut client, vec![share.clone()]).await, unprepare(&mut client, vec![share]).await);
        let (q, v) = (prepare(&mut client, vec![whole.clone()]).await, unprepare(&mut client, vec![whole]).await);
        if k >= WARMUP {
            sh_prep.push(p);
            sh_release.push(u);
            ex_prep.push(q);
            ex_release.push(v);
        }
    }
    unprepare(&mut client, held).await;
    println!(
        "## Shares ({SHARED} 20Gi shares of GPUs that hold four 10Gi shares each, interleaved with as many whole-GPU \
         claims; mock GPUs = 8, rate limit lifted)\n"
    );
    println!("{}", latency_header());
    println!("{}", sh_prep.row("prepare, a share"));
    println!("{}", ex_prep.row("prepare, a whole GPU (same run)"));
    println!("{}", sh_release.row("unprepare, a share"));
    println!("{}", ex_release.row("unprepare, a whole GPU (same run)"));
    println!();
    agent.stop();
    mps_shares().await;
}

/// Shares measured with MPS enforcement.
const MPS_SHARES: usize = 100;

/// Shares with `sharing.enforcement = "mps"`: the first share of a GPU records and sets
/// EXCLUSIVE_PROCESS and records and starts the GPU's daemon (the stand-in script, in its
/// own mount namespace), its release quits it and puts the mode back; a later share only
/// checks the running daemon (a /proc read) and adds the daemon's mounts and its limit to
/// its spec. First shares go to gpu-4..7 (each alone there), later ones to gpu-0..3, which
/// hold a 10Gi share (and so a running daemon) throughout. Needs root.
async fn mps_shares() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("## Shares with MPS enforcement: skipped (an MPS daemon's own mount namespace needs root)\n");
        return;
    }
    let settings =
        SiteSettings { gpus: 8, rate_limit: UNLIMITED, layout: Layout::Production, ..SiteSettings::default() };
    let site = Site::new(Options::default(), settings).await;
    let control =
        support::mps::FakeMpsControl::install(&site.config.paths.driver_root.join("usr/bin/nvidia-cuda-mps-control"));
    let mut config = site.config.clone();
    config.sharing.enforcement = edra::sharing::Enforcement::Mps;
    let agent = InProcessAgent::start(config).await;
    site.wait_published(8, Duration::from_secs(30)).await;
    common::register(&site.registration_socket()).await;
    let mut client = support::kubelet::dra_v1(&site.dra_socket()).await;
    let held: Vec<_> = (0..4).map(|g| site.claim_share(&format!("held{g}"), &format!("gpu-{g}"), "10Gi")).collect();
    prepare(&mut client, held.clone()).await;
    let (mut first_prep, mut first_release) = (Samples::default(), Samples::default());
    let (mut later_prep, mut later_release) = (Samples::default(), Samples::default());
    let warmup = 5;
    for k in 0..(warmup + MPS_SHARES) {
        let first = site.claim_share(&format!("first{k}"), &format!("gpu-{}", 4 + k % 4), "20Gi");
        let later = site.claim_share(&format!("later{k}"), &format!("gpu-{}", k % 4), "20Gi");
        let (p, u) = (prepare(&mut client, vec![first.clone()]).await, unprepare(&mut client, vec![first]).await);
        let (q, v) = (prepare(&mut client, vec![later.clone()]).await, unprepare(&mut client, vec![later]).await);
        if k >= warmup {
            first_prep.push(p);
            first_release.push(u);
            later_prep.push(q);
            later_release.push(v);
        }
    }
    unprepare(&mut client, held).await;
    let starts = control.calls().iter().filter(|c| c.starts_with("-d")).count();
    assert_eq!(starts, 4 + warmup + MPS_SHARES, "one daemon per first share, none for later shares");
    println!(
        "## Shares with MPS enforcement ({MPS_SHARES} first shares of a GPU, interleaved with as many later shares of \
         GPUs whose daemon runs; stand-in daemon; mock GPUs = 8, rate limit lifted)\n"
    );
    println!("{}", latency_header());
    println!("{}", first_prep.row("prepare, first share (daemon start)"));
    println!("{}", later_prep.row("prepare, later share (daemon reused)"));
    println!("{}", first_release.row("unprepare, last share (daemon quit)"));
    println!("{}", later_release.row("unprepare, a share (daemon kept)"));
    println!();
    agent.stop();
}

/// Claims measured in the MPS section.
const MPS_CLAIMS: usize = 100;

/// MPS claims: prepare adds EXCLUSIVE_PROCESS (a durable GPU change record and a set), a
/// durable daemon record before and after the start, the daemon's start in its own mount
/// namespace, its readiness (`get_server_list` through the control client) and one limit;
/// unprepare `quit` and waiting for the daemon to go. The daemon and its control client are
/// the stand-in script (fork/exec of `sh` each time), so the figure is edra's overhead plus
/// the stand-in's; a real daemon takes longer to come up. Needs root (the mount namespace).
async fn mps() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("## MPS: skipped (starting an MPS daemon in its own mount namespace needs root)\n");
        return;
    }
    let (site, agent, mut client) = ready_site(8, UNLIMITED, Layout::Production).await;
    let control =
        support::mps::FakeMpsControl::install(&site.config.paths.driver_root.join("usr/bin/nvidia-cuda-mps-control"));
    let config = serde_json::json!({"apiVersion": format!("{}/v1alpha1", common::DRIVER), "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}});
    let (mut prep, mut release, mut repeat) = (Samples::default(), Samples::default(), Samples::default());
    let warmup = 5;
    for k in 0..(warmup + MPS_CLAIMS) {
        let claim = site.claim_with(&format!("mps{k}"), &[format!("gpu-{}", k % 8)], Some(config.clone()));
        let p = prepare(&mut client, vec![claim.clone()]).await;
        let r = prepare(&mut client, vec![claim.clone()]).await;
        let u = unprepare(&mut client, vec![claim]).await;
        if k >= warmup {
            prep.push(p);
            repeat.push(r);
            release.push(u);
        }
    }
    let starts = control.calls().iter().filter(|c| c.starts_with("-d")).count();
    assert_eq!(starts, warmup + MPS_CLAIMS, "one daemon per prepared claim");
    // The daemon layer alone (edra's supervisor driving the stand-in), without gRPC, state or CDI.
    let sup = edra::gpu::mps::Supervisor {
        settings: edra::prepare::PrepareSettings::from_config(&site.config, "/usr/bin/edra".into()).mps,
    };
    let (mut start_alone, mut stop_alone) = (Samples::default(), Samples::default());
    for k in 0..MPS_CLAIMS {
        let spec = edra::gpu::mps::DaemonSpec {
            id: format!("bench-{k}"),
            gpus: vec!["GPU-bench".into()],
            active_thread_percentage: Some(50),
            pinned_memory_mib: vec![],
        };
        let t = Instant::now();
        let daemon = edra::gpu::mps::MpsDaemons::start(&sup, &spec).expect("the stand-in daemon starts");
        start_alone.push(t.elapsed());
        let t = Instant::now();
        edra::gpu::mps::MpsDaemons::stop(&sup, &spec.id, Some(&daemon)).expect("the stand-in daemon stops");
        stop_alone.push(t.elapsed());
    }
    println!(
        "## MPS ({MPS_CLAIMS} claims, each prepared, prepared again, unprepared; stand-in daemon; rate limit lifted)\n"
    );
    println!("{}", latency_header());
    println!("{}", prep.row("prepare, MPS (daemon start)"));
    println!("{}", repeat.row("prepare again (from state)"));
    println!("{}", release.row("unprepare, MPS (quit)"));
    println!("{}", start_alone.row("  daemon start + ready alone"));
    println!("{}", stop_alone.row("  daemon quit alone"));
    println!();
    agent.stop();
}

/// Claims measured in the TimeSlicing section.
const TIME_SLICED: usize = 300;

/// TimeSlicing claims: prepare adds a read and a set of the compute mode (the mock backend's
/// memory), a durable GPU change record and one `nvidia-smi` run (the stand-in script, so
/// the figure is edra's overhead plus a fork/exec of `sh`; a real nvidia-smi takes longer),
/// unprepare another run and a set.
async fn time_slicing() {
    let (site, agent, mut client) = ready_site(8, UNLIMITED, Layout::Production).await;
    let smi = support::nvidia_smi::FakeNvidiaSmi::install(&site.config.paths.driver_root.join("usr/bin/nvidia-smi"));
    let config = serde_json::json!({"apiVersion": format!("{}/v1alpha1", common::DRIVER), "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Medium"}}});
    let (mut ts_prep, mut ts_release) = (Samples::default(), Samples::default());
    let (mut ex_prep, mut ex_release) = (Samples::default(), Samples::default());
    for k in 0..(WARMUP + TIME_SLICED) {
        let gpu = vec![format!("gpu-{}", k % 8)];
        let ts = site.claim_with(&format!("ts{k}"), &gpu, Some(config.clone()));
        let ex = site.claim(&format!("ex{k}"), &gpu);
        let (p, u) = (prepare(&mut client, vec![ts.clone()]).await, unprepare(&mut client, vec![ts]).await);
        let (q, v) = (prepare(&mut client, vec![ex.clone()]).await, unprepare(&mut client, vec![ex]).await);
        if k >= WARMUP {
            ts_prep.push(p);
            ts_release.push(u);
            ex_prep.push(q);
            ex_release.push(v);
        }
    }
    assert_eq!(smi.calls().len(), 2 * (WARMUP + TIME_SLICED), "one nvidia-smi run per prepare and per unprepare");
    // The stand-in alone, as edra runs it.
    let runner = edra::gpu::timeslice::NvidiaSmi::new(Some(&smi.path), &site.config.paths.driver_root, None);
    let mut alone = Samples::default();
    for _ in 0..TIME_SLICED {
        let start = Instant::now();
        runner.set_timeslice("GPU-bench", 0).expect("the stand-in runs");
        alone.push(start.elapsed());
    }
    println!(
        "## TimeSlicing ({TIME_SLICED} claims, each prepared then unprepared, interleaved with as many Exclusive ones; \
         mock GPUs = 8, stand-in nvidia-smi, rate limit lifted)\n"
    );
    println!("{}", latency_header());
    println!("{}", ts_prep.row("prepare, TimeSlicing"));
    println!("{}", ex_prep.row("prepare, Exclusive (same run)"));
    println!("{}", ts_release.row("unprepare, TimeSlicing"));
    println!("{}", ex_release.row("unprepare, Exclusive (same run)"));
    println!("{}", alone.row("  one run of the stand-in nvidia-smi"));
    println!();
    agent.stop();
}

async fn prepare(client: &mut DraPluginClient<Channel>, claims: Vec<v1::Claim>) -> Duration {
    let n = claims.len();
    let start = Instant::now();
    let answer = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims })
        .await
        .expect("NodePrepareResources")
        .into_inner();
    let took = start.elapsed();
    assert_eq!(answer.claims.len(), n, "one answer per claim");
    for (uid, r) in &answer.claims {
        assert!(r.error.is_empty(), "prepare of {uid} failed: {}", r.error);
        assert!(!r.devices.is_empty(), "prepare of {uid} returned no devices");
    }
    took
}

async fn unprepare(client: &mut DraPluginClient<Channel>, claims: Vec<v1::Claim>) -> Duration {
    let start = Instant::now();
    let answer = client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims })
        .await
        .expect("NodeUnprepareResources")
        .into_inner();
    let took = start.elapsed();
    for (uid, r) in &answer.claims {
        assert!(r.error.is_empty(), "unprepare of {uid} failed: {}", r.error);
    }
    took
}

/// The client rate limit lifted to the highest accepted values, as for the reference figures: back-to-back prepares exceed
/// edra's default 100 requests/s once its burst of 200 is spent.
const UNLIMITED: Option<(u32, u32)> = Some((10_000, 10_000));

async fn ready_site(
    gpus: u32,
    rate_limit: Option<(u32, u32)>,
    layout: Layout,
) -> (Site, InProcessAgent, DraPluginClient<Channel>) {
    ready_site_with(SiteSettings { gpus, rate_limit, layout, ..SiteSettings::default() }).await
}

async fn ready_site_with(settings: SiteSettings) -> (Site, InProcessAgent, DraPluginClient<Channel>) {
    let gpus = settings.gpus;
    let site = Site::new(Options::default(), settings).await;
    let agent = InProcessAgent::start(site.config.clone()).await;
    site.wait_published(gpus as usize, Duration::from_secs(30)).await;
    common::register(&site.registration_socket()).await;
    let client = support::kubelet::dra_v1(&site.dra_socket()).await;
    (site, agent, client)
}

/// What the breakdown needs from a live site: its configuration and a real CDI spec.
struct Sample {
    config: edra::config::Config,
    spec: cdi::Spec,
    claim: v1::Claim,
    site: Site,
}

/// One claim per call: prepare (API GET + sled + CDI), repeated prepare (sled only), unprepare.
async fn single(gpus: u32, layout: Layout) -> Sample {
    let (site, agent, mut client) = ready_site(gpus, UNLIMITED, layout).await;
    let (mut first, mut again, mut release) = (Samples::default(), Samples::default(), Samples::default());
    let mut gets = 0usize;
    let mut server_get = Samples::default();
    let (mut to_get, mut after_get) = (Samples::default(), Samples::default());
    let total = WARMUP + SINGLE;
    let phases = phases();
    let mut steps = Steps::default();
    let mut i = 0;
    while i < total {
        let wave: Vec<v1::Claim> = (i..(i + gpus as usize).min(total))
            .map(|k| site.claim(&format!("c{k}"), &[format!("gpu-{}", k % gpus as usize)]))
            .collect();
        let measured = i >= WARMUP;
        let mark = site.server.request_mark();
        for c in &wave {
            let before = site.server.request_mark();
            if let Some(p) = &phases {
                p.take();
            }
            let start = Instant::now();
            let d = prepare(&mut client, vec![c.clone()]).await;
            let end = Instant::now();
            if measured {
                first.push(d);
                if let Some(p) = &phases {
                    steps.add(p.take(), d);
                }
                // The claim's GET (a status PATCH of an earlier claim may come between).
                let log = site.server.requests();
                if let Some(get) = log.iter().skip(before).find(|r| r.verb == "get") {
                    to_get.push(get.at.saturating_duration_since(start));
                    after_get.push(end.saturating_duration_since(get.at + get.duration));
                }
            }
        }
        if measured {
            let log = site.server.requests();
            for r in log.iter().skip(mark) {
                // Claims' status.devices, written off the prepare path (publish::claim_status).
                if r.verb == "patch" && r.path.ends_with("/status") {
                    continue;
                }
                gets += 1;
                assert_eq!(r.verb, "get", "only claim GETs expected while preparing: {} {}", r.method, r.path);
                server_get.push(r.duration);
            }
        }
        let mark = site.server.request_mark();
        for c in &wave {
            let d = prepare(&mut client, vec![c.clone()]).await;
            if measured {
                again.push(d);
            }
        }
        // Only reads count: a claim's status PATCH may land here, written off the prepare path.
        let reads = site.server.requests().iter().skip(mark).filter(|r| r.verb != "patch").count();
        assert_eq!(reads, 0, "a repeated prepare must not ask the API server");
        for c in &wave {
            let d = unprepare(&mut client, vec![c.clone()]).await;
            if measured {
                release.push(d);
            }
        }
        i += wave.len();
    }
    println!(
        "## One claim per call ({SINGLE} distinct claims, mock GPUs = {gpus}, after {WARMUP} warm-up claims, client rate limit lifted)\n\n{}\n",
        site.layout_note
    );
    println!("{}", latency_header());
    println!("{}", first.row("prepare (API GET + sled + CDI spec)"));
    println!("{}", again.row("repeated prepare of a prepared claim (sled)"));
    println!("{}", release.row("unprepare"));
    println!("{}", to_get.row("  prepare: call → GET arrives at the server"));
    println!("{}", server_get.row("  prepare: server answers the GET"));
    println!("{}", after_get.row("  prepare: GET answered → call returns"));
    println!();
    println!(
        "API requests per prepare: {:.2} (GET of the claim); per repeated prepare and unprepare: 0\n",
        gets as f64 / SINGLE as f64
    );
    if phases.is_some() {
        steps.print();
    }
    // Keep one claim prepared: its spec is what the breakdown writes.
    let claim = site.claim("sample", &["gpu-0".to_string()]);
    prepare(&mut client, vec![claim.clone()]).await;
    let path =
        site.config.paths.cdi_dynamic_dir.join(cdi::spec_file_name(&format!("k8s.{}", common::DRIVER), &claim.uid));
    let spec: cdi::Spec =
        serde_json::from_slice(&std::fs::read(&path).expect("read the sample spec")).expect("parse the sample spec");
    agent.stop();
    Sample { config: site.config.clone(), spec, claim, site }
}

/// The span timer, installed once when `BENCH_PHASES` is set.
fn phases() -> Option<Phases> {
    static PHASES: std::sync::OnceLock<Phases> = std::sync::OnceLock::new();
    std::env::var_os("BENCH_PHASES").map(|_| PHASES.get_or_init(Phases::install).clone())
}

/// One call with 32 claims (mock GPUs = 32), prepared then unprepared.
async fn batch() {
    let (site, agent, mut client) = ready_site(BATCH as u32, UNLIMITED, Layout::Production).await;
    let (mut prep, mut again, mut release) = (Samples::default(), Samples::default(), Samples::default());
    for call in 0..(BATCH_CALLS + 2) {
        let claims: Vec<v1::Claim> =
            (0..BATCH).map(|k| site.claim(&format!("b{call}-{k}"), &[format!("gpu-{k}")])).collect();
        let p = prepare(&mut client, claims.clone()).await;
        let a = prepare(&mut client, claims.clone()).await;
        let u = unprepare(&mut client, claims).await;
        if call >= 2 {
            prep.push(p);
            again.push(a);
            release.push(u);
        }
    }
    println!(
        "## {BATCH} claims per call ({BATCH_CALLS} calls, mock GPUs = {BATCH}, after 2 warm-up calls, rate limit lifted)\n"
    );
    println!("{}", latency_header());
    println!("{}", prep.row("prepare, 32 claims"));
    println!("{}", again.row("repeated prepare, 32 claims"));
    println!("{}", release.row("unprepare, 32 claims"));
    println!();
    println!("per claim in a 32-claim call: prepare p50 {:.3} ms", ms(prep.percentile(50.0)) / BATCH as f64);
    agent.stop();
}

/// Prepares each of `claims` in a call of its own, all at once; the time of each call.
async fn concurrent_prepares(client: &DraPluginClient<Channel>, claims: Vec<v1::Claim>) -> Samples {
    let calls = claims.into_iter().map(|c| {
        let mut client = client.clone();
        tokio::spawn(async move { prepare(&mut client, vec![c]).await })
    });
    let mut each = Samples::default();
    for call in futures_util::future::join_all(calls).await {
        each.push(call.expect("prepare task"));
    }
    each
}

/// A burst of 50 pod starts with edra's default client settings: 50 concurrent calls, one
/// claim each, on 50 mock GPUs.
async fn burst() {
    const PODS: usize = 50;
    let (site, agent, client) = ready_site(PODS as u32, None, Layout::Production).await;
    let claims: Vec<v1::Claim> = (0..PODS).map(|k| site.claim(&format!("p{k}"), &[format!("gpu-{k}")])).collect();
    let start = Instant::now();
    let each = concurrent_prepares(&client, claims).await;
    let all = start.elapsed();
    println!("## A burst of {PODS} pod starts, default client settings (qps 100, burst 200)\n");
    println!("{}", latency_header());
    println!("{}", each.row("prepare, 50 concurrent calls"));
    println!();
    println!("all {PODS} prepared after {:.1} ms\n", ms(all));
    agent.stop();
}

/// Where a prepare's time goes: each durable step and the API GET alone, on the production
/// layout (state on disk, CDI specs on tmpfs when there is one) and against the same server.
async fn breakdown(sample: Sample) {
    const N: usize = 500;
    let dir = sample.site.dir.path().join("breakdown");
    std::fs::create_dir_all(&dir).expect("breakdown dir");

    let mut fsync = Samples::default();
    let file = dir.join("fsync-probe");
    for _ in 0..N {
        let t = Instant::now();
        let mut f = std::fs::File::create(&file).expect("create the probe");
        std::io::Write::write_all(&mut f, &[0u8; 1024]).expect("write the probe");
        f.sync_all().expect("fsync the probe");
        fsync.push(t.elapsed());
    }

    let store = Store::open(&dir.join("state")).expect("open a store");
    let (mut started, mut completed, mut read, mut removed) =
        (Samples::default(), Samples::default(), Samples::default(), Samples::default());
    let (mut spec_write, mut spec_remove) = (Samples::default(), Samples::default());
    let cdi_dir = sample.site.cdi_dir.join("breakdown");
    std::fs::create_dir_all(&cdi_dir).expect("breakdown CDI dir");
    for i in 0..N {
        let uid = format!("00000000-0000-4000-8000-{i:012x}");
        let mut rec = ClaimRecord {
            schema: SCHEMA_VERSION,
            uid: uid.clone(),
            namespace: common::NAMESPACE.into(),
            name: format!("r{i}"),
            phase: Phase::PrepareStarted,
            devices: vec![DeviceRecord {
                request: "gpu0".into(),
                request_names: vec!["gpu0".into()],
                device: format!("gpu-{}", i % 8),
                pool: common::NODE.into(),
                cdi_ids: vec![format!("k8s.{}/claim={uid}-gpu-{}", common::DRIVER, i % 8)],
                admin_access: false,
                share_id: None,
                share: None,
                mig: None,
                config: Default::default(),
            }],
            cdi_spec_path: cdi_dir.join(format!("{uid}.json")),
            created_at: 0,
            boot_id: String::new(),
        };
        let t = Instant::now();
        store.put_claim(&rec).expect("put PrepareStarted");
        started.push(t.elapsed());
        let t = Instant::now();
        cdi::write_spec(&rec.cdi_spec_path, &sample.spec).expect("write the spec");
        spec_write.push(t.elapsed());
        rec.phase = Phase::PrepareCompleted;
        let t = Instant::now();
        store.put_claim(&rec).expect("put PrepareCompleted");
        completed.push(t.elapsed());
        let t = Instant::now();
        store.claim(&uid).expect("read").expect("record present");
        read.push(t.elapsed());
        let t = Instant::now();
        cdi::remove_spec(&rec.cdi_spec_path).expect("remove the spec");
        spec_remove.push(t.elapsed());
        let t = Instant::now();
        store.remove_claim(&uid).expect("remove");
        removed.push(t.elapsed());
    }

    let mut config = sample.config.clone();
    (config.kube.qps, config.kube.burst) = (10_000.0, 10_000);
    let client = edra::kube::Client::from_config(&config).expect("client");
    let api = client.discover_resource_api().await.expect("discovery");
    let mut get = Samples::default();
    for _ in 0..N {
        let t = Instant::now();
        client.get_claim(api, &sample.claim.namespace, &sample.claim.name).await.expect("GET the claim");
        get.push(t.elapsed());
    }

    println!("## Where the time goes ({N} runs of each step, same server; {})\n", sample.site.layout_note);
    println!("{}", latency_header());
    println!("{}", fsync.row("write 1 KiB + fsync (reference)"));
    println!("{}", get.row("API GET of a claim (edra client, no limit)"));
    println!("{}", read.row("sled read of a record"));
    println!("{}", started.row("sled commit PrepareStarted (durable)"));
    println!("{}", spec_write.row("CDI spec write+fsync+rename+dir fsync"));
    println!("{}", completed.row("sled commit PrepareCompleted (durable)"));
    println!("{}", spec_remove.row("CDI spec remove + dir fsync"));
    println!("{}", removed.row("sled remove record (durable)"));
    println!();
    println!("CDI spec size: {} bytes", serde_json::to_vec_pretty(&sample.spec).map_or(0, |v| v.len()));
}

/// Pods started one after another as a scheduler and kubelet start them: each claim's pod is
/// bound to the node on the API server, and the kubelet's prepare comes `lead` later (the
/// real kubelet calls after it has seen the pod and admitted it, and after its own GET of
/// the claim). After each prepare the claim is unprepared and the pod deleted.
async fn pod_starts(prefetch: bool, lead: Duration) -> (Samples, usize, usize) {
    const GPUS: u32 = 8;
    let settings = SiteSettings { gpus: GPUS, rate_limit: UNLIMITED, prefetch, ..SiteSettings::default() };
    let (site, agent, mut client) = ready_site_with(settings).await;
    let mut took = Samples::default();
    let (mut gets, mut answered_before) = (0usize, 0usize);
    for k in 0..(WARMUP + SINGLE) {
        let name = format!("c{k}");
        let claim = site.claim(&name, &[format!("gpu-{}", k % GPUS as usize)]);
        let mark = site.server.request_mark();
        site.bind_pod(&name, &name);
        tokio::time::sleep(lead).await;
        let start = Instant::now();
        let d = prepare(&mut client, vec![claim.clone()]).await;
        if k >= WARMUP {
            took.push(d);
            // Every GET of the claim since the pod was bound, and those answered before the
            // kubelet's call was made (read early, kept for it).
            let path = format!("/resourceclaims/{name}");
            let log = site.server.requests();
            let of_claim = || log.iter().skip(mark).filter(|r| r.verb == "get" && r.path.ends_with(&path));
            gets += of_claim().count();
            answered_before += of_claim().filter(|r| r.at + r.duration < start).count();
        }
        unprepare(&mut client, vec![claim]).await;
        site.delete_pod(&name);
    }
    agent.stop();
    (took, gets, answered_before)
}

/// How long the kubelet's call comes after its pod is bound, in [`pod_starts_table`].
const LEADS: [Duration; 2] = [Duration::from_millis(5), Duration::ZERO];

/// First-time prepares as pods start, with and without `claims.prefetch`, and the burst of
/// 50 pod starts with it.
async fn pod_starts_table() {
    let mut rows = Vec::new();
    for lead in LEADS {
        for prefetch in [false, true] {
            let (samples, gets, before) = pod_starts(prefetch, lead).await;
            let what = format!(
                "prepare, prefetch {}, call {} ms after bind",
                if prefetch { "on" } else { "off" },
                lead.as_millis()
            );
            rows.push((samples.row(&what), gets, before, prefetch, lead));
        }
    }
    println!(
        "## First-time prepare as pods start ({SINGLE} pods one after another, each bound to the node on the API \
         server, the kubelet's call a little later; mock GPUs = 8, after {WARMUP} warm-up pods, rate limit lifted)\n"
    );
    println!("{}", latency_header());
    for (row, ..) in &rows {
        println!("{row}");
    }
    println!();
    for (_, gets, before, prefetch, lead) in &rows {
        println!(
            "prefetch {}, {} ms: GETs of the claim per pod: {:.2}, of them answered before the kubelet's call: {:.2}",
            if *prefetch { "on" } else { "off" },
            lead.as_millis(),
            *gets as f64 / SINGLE as f64,
            *before as f64 / SINGLE as f64
        );
    }
    println!();
    burst_of_pods(LEADS[0]).await.print();
    burst_of_pods(Duration::from_millis(50)).await.print();
}

/// The burst of 50 pod starts (calls 5 ms after binding), [`BURSTS`] times: one burst is one
/// figure, so its spread shows only over several. With `BURST_TIMELINE` set, each burst's
/// timeline goes to stderr ([`Timeline`]).
async fn bursts() {
    const BURSTS: usize = 10;
    let mut all = Vec::with_capacity(BURSTS);
    let mut cpu = Vec::with_capacity(BURSTS);
    for _ in 0..BURSTS {
        let burst = burst_of_pods(LEADS[0]).await;
        if std::env::var_os("BURST_TIMELINE").is_some() {
            eprintln!("{}", burst.timeline);
        }
        all.push(ms(burst.all));
        cpu.push(ms(burst.cpu));
    }
    println!(
        "## {BURSTS} bursts of 50 pod starts with prefetch, calls {} ms after bind, default client settings\n",
        LEADS[0].as_millis()
    );
    for (what, values) in [("all 50 prepared after", all), ("CPU time of the process, bindings to last answer", cpu)] {
        let shown: Vec<String> = values.iter().map(|v| format!("{v:.1}")).collect();
        println!("{what} (ms, in run order): {}", shown.join(", "));
        let (min, median, max) = spread(values);
        println!("min {min:.1}, median {median:.1}, max {max:.1} ms");
    }
}

/// The smallest, median and largest of `values` (not empty).
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n.is_multiple_of(2) { (values[n / 2 - 1] + values[n / 2]) / 2.0 } else { values[n / 2] };
    (values[0], median, values[n - 1])
}

/// The CPU time this process has used (every thread: agent, API server and client).
fn process_cpu() -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec to the valid pointer it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    Duration::new(t.tv_sec.try_into().unwrap_or(0), t.tv_nsec.try_into().unwrap_or(0))
}

/// When, in milliseconds after the first pod was bound, each step of a burst happened:
/// the claims' GETs began and ended (at the API server), their CDI specs were written (the
/// file's mtime: the claim prepared), and the kubelet's calls were answered.
struct Timeline {
    bound: f64,
    calls: f64,
    gets: Vec<(f64, f64)>,
    specs: Vec<f64>,
    answers: Vec<f64>,
}

impl std::fmt::Display for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &mut dyn Iterator<Item = f64>| v.map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(" ");
        writeln!(f, "pods bound by {:.1} ms, calls at {:.1} ms", self.bound, self.calls)?;
        writeln!(f, "GETs began:    {}", list(&mut self.gets.iter().map(|g| g.0)))?;
        writeln!(f, "GETs answered: {}", list(&mut self.gets.iter().map(|g| g.1)))?;
        writeln!(f, "specs written: {}", list(&mut self.specs.iter().copied()))?;
        write!(f, "calls answered: {}", list(&mut self.answers.iter().copied()))
    }
}

/// Pods started at once in [`burst_of_pods`].
const BURST_PODS: usize = 50;

/// What one burst of pod starts measured.
struct Burst {
    /// How long after their pods were bound the kubelet's calls began.
    lead: Duration,
    /// Each call's latency.
    each: Samples,
    /// From the first call to the last answer.
    all: Duration,
    /// GETs of the claims, and how many of them were answered after the calls began.
    gets: usize,
    late: usize,
    /// CPU time of the whole process from the bindings to the last answer.
    cpu: Duration,
    timeline: Timeline,
}

impl Burst {
    fn print(&self) {
        println!("## A burst of {BURST_PODS} pod starts with prefetch, default client settings (qps 100, burst 200)\n");
        println!("{}", latency_header());
        println!("{}", self.each.row(&format!("prepare, 50 concurrent calls {} ms after bind", self.lead.as_millis())));
        println!();
        println!(
            "all {BURST_PODS} prepared after {:.1} ms; GETs of the claims: {}, answered after the calls began: {}\n",
            ms(self.all),
            self.gets,
            self.late
        );
    }
}

/// The burst of 50 pod starts with `claims.prefetch` at edra's default client settings: 50
/// pods bound at once, the kubelet's 50 concurrent calls `lead` later.
async fn burst_of_pods(lead: Duration) -> Burst {
    let (site, agent, client) = ready_site(BURST_PODS as u32, None, Layout::Production).await;
    let claims: Vec<v1::Claim> = (0..BURST_PODS).map(|k| site.claim(&format!("p{k}"), &[format!("gpu-{k}")])).collect();
    let mark = site.server.request_mark();
    // `perf record --control fifo:<fifo> -D -1` samples the bursts only.
    let perf = |command: &str| {
        if let Some(fifo) = std::env::var_os("BURST_PERF_CTL") {
            std::fs::write(fifo, command).expect("write to the perf control fifo");
        }
    };
    perf("enable\n");
    let (cpu_before, bind, bind_wall) = (process_cpu(), Instant::now(), std::time::SystemTime::now());
    for k in 0..BURST_PODS {
        site.bind_pod(&format!("p{k}"), &format!("p{k}"));
    }
    let bound = bind.elapsed();
    tokio::time::sleep(lead).await;
    let start = Instant::now();
    let each = concurrent_prepares(&client, claims).await;
    let all = start.elapsed();
    let cpu = process_cpu().saturating_sub(cpu_before);
    perf("disable\n");
    let after_bind = |i: Instant| ms(i.saturating_duration_since(bind));
    let claim_gets: Vec<_> = site.server.requests().into_iter().skip(mark).filter(|r| r.verb == "get").collect();
    let late = claim_gets.iter().filter(|r| r.at + r.duration >= start).count();
    let mut gets: Vec<(f64, f64)> =
        claim_gets.iter().map(|r| (after_bind(r.at), after_bind(r.at + r.duration))).collect();
    gets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut specs: Vec<f64> = std::fs::read_dir(&site.config.paths.cdi_dynamic_dir)
        .expect("the CDI directory")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("claim_"))
        .filter_map(|e| e.metadata().ok()?.modified().ok()?.duration_since(bind_wall).ok())
        .map(ms)
        .collect();
    specs.sort_by(f64::total_cmp);
    let mut answers: Vec<f64> = each.0.iter().map(|d| after_bind(start + *d)).collect();
    answers.sort_by(f64::total_cmp);
    agent.stop();
    let timeline = Timeline { bound: ms(bound), calls: after_bind(start), gets, specs, answers };
    Burst { lead, each, all, gets: claim_gets.len(), late, cpu, timeline }
}
