//! edra's Prometheus metrics: what is counted, and how it is read at scrape time.
//!
//! Two kinds of sources feed one [`Metrics`] registry (no global registry):
//! - [`CallMetrics`], the plugin server's [`CallObserver`]: prepare and unprepare calls by
//!   version and outcome, claims by outcome, call latency histograms and registration
//!   refusals, counted as they happen;
//! - [`StateSources`], read at every scrape by a collector: the publisher's status,
//!   the kubelet registration state, and the API client's request counts. Nothing is
//!   copied between scrapes, so these can never drift from what the agent reports.
//!
//! GPU use (shares, memory, MIG instances) and the state store's health are read at
//! scrape time too (`gpu_use`). Every name starts with `edra_`; docs/metrics.md
//! lists them all.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use tokio::sync::watch;

use crate::kube::RequestStats;
use crate::plugin::{CallObserver, CallOutcome, CallReport, DraMethod, RegistrationState, SUPPORTED_VERSIONS};
use crate::publish::status::PublishStatus;
use crate::telemetry::gpu_use::{GpuUseCollector, StoreCollector};

/// Latency buckets in seconds, from 0.1 ms (a prepare answered from state) up to the
/// kubelet's 45 s call timeout.
pub const LATENCY_BUCKETS: [f64; 18] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 45.0];

/// The content type of [`Metrics::encode`]'s output.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of the per-call counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CallLabels {
    version: &'static str,
    outcome: &'static str,
}

/// Labels of the per-claim counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClaimLabels {
    outcome: &'static str,
}

const CLAIM_OK: ClaimLabels = ClaimLabels { outcome: "ok" };
const CLAIM_ERROR: ClaimLabels = ClaimLabels { outcome: "error" };

/// The metrics of one DRAPlugin method.
#[derive(Debug, Clone)]
struct MethodMetrics {
    requests: Family<CallLabels, Counter>,
    claims: Family<ClaimLabels, Counter>,
    duration: Histogram,
}

impl MethodMetrics {
    fn new() -> Self {
        let m = MethodMetrics {
            requests: Family::default(),
            claims: Family::default(),
            duration: Histogram::new(LATENCY_BUCKETS),
        };
        // Every series exists from the start, so rates and alerts work before the first error.
        let versions = SUPPORTED_VERSIONS.iter().map(|v| v.trim_end_matches(".DRAPlugin"));
        for version in versions {
            for outcome in [CallOutcome::Ok, CallOutcome::ClaimErrors, CallOutcome::Failed] {
                let _ = m.requests.get_or_create(&CallLabels { version, outcome: outcome.as_str() });
            }
        }
        let _ = m.claims.get_or_create(&CLAIM_OK);
        let _ = m.claims.get_or_create(&CLAIM_ERROR);
        m
    }

    fn record(&self, report: &CallReport) {
        self.requests.get_or_create(&CallLabels { version: report.version, outcome: report.outcome.as_str() }).inc();
        self.claims.get_or_create(&CLAIM_OK).inc_by(report.claims_ok);
        self.claims.get_or_create(&CLAIM_ERROR).inc_by(report.claims_failed);
        self.duration.observe(report.duration.as_secs_f64());
    }
}

/// What the plugin server reports, counted as it happens. Give it to the plugin server as
/// its observer, then to [`Metrics::new`].
#[derive(Debug)]
pub struct CallMetrics {
    prepare: MethodMetrics,
    unprepare: MethodMetrics,
    refusals: Counter,
}

impl CallMetrics {
    /// Counters at zero.
    pub fn new() -> Arc<Self> {
        Arc::new(CallMetrics {
            prepare: MethodMetrics::new(),
            unprepare: MethodMetrics::new(),
            refusals: Counter::default(),
        })
    }
}

impl CallObserver for CallMetrics {
    fn call_finished(&self, report: &CallReport) {
        match report.method {
            DraMethod::Prepare => self.prepare.record(report),
            DraMethod::Unprepare => self.unprepare.record(report),
        }
    }

    fn registration_status(&self, registered: bool) {
        if !registered {
            self.refusals.inc();
        }
    }
}

/// Reads the API client's request counts (usually `Client::stats`).
pub type StatsSource = Arc<dyn Fn() -> RequestStats + Send + Sync>;

/// What the agent reports about its state, read at every scrape.
#[derive(Clone)]
pub struct StateSources {
    /// The kubelet's verdict on the registration.
    pub registration: watch::Receiver<RegistrationState>,
    /// The publisher's status.
    pub publish: watch::Receiver<PublishStatus>,
    /// The API client's request counts.
    pub api_stats: StatsSource,
}

impl std::fmt::Debug for StateSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateSources")
            .field("registration", &*self.registration.borrow())
            .field("publish", &*self.publish.borrow())
            .finish_non_exhaustive()
    }
}

/// Encodes [`StateSources`] at scrape time.
#[derive(Debug)]
struct StateCollector(StateSources);

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let publish = self.0.publish.borrow().clone();
        let registered = self.0.registration.borrow().is_registered();
        let stats = (self.0.api_stats)();

        let devices = i64::try_from(publish.devices).unwrap_or(i64::MAX);
        let help = "Devices edra publishes in this node's ResourceSlices, as of the last reconcile";
        gauge(&mut encoder, "edra_published_devices", help, None, devices)?;
        gauge(
            &mut encoder,
            "edra_slices_in_sync",
            "1 when the published ResourceSlices match the discovered devices, else 0",
            None,
            i64::from(publish.in_sync),
        )?;
        let help = "ResourceSlice writes (create, update, delete) attempted";
        counter(&mut encoder, "edra_publish_writes", help, None, publish.writes)?;
        gauge(
            &mut encoder,
            "edra_kubelet_registered",
            "1 when the kubelet accepted the plugin registration, else 0",
            None,
            i64::from(registered),
        )?;

        let requests = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "edra_api_requests",
            "Kubernetes API requests by verb and HTTP status code (0: no response)",
            None,
            requests.metric_type(),
        )?;
        for ((verb, code), n) in &stats.requests {
            let labels = [("verb", verb.clone()), ("code", code.to_string())];
            ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
        }
        let help = "Request body bytes sent to the API server";
        counter(&mut encoder, "edra_api_sent", help, Some(&Unit::Bytes), stats.bytes_sent)?;
        counter(
            &mut encoder,
            "edra_api_received",
            "Response body bytes received from the API server",
            Some(&Unit::Bytes),
            stats.bytes_received,
        )?;
        Ok(())
    }
}

/// Encodes the GPU setting changes at scrape time.
#[derive(Debug)]
struct GpuChangeCollector(Arc<crate::gpu::ChangeCounts>);

impl Collector for GpuChangeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "edra_gpu_setting_changes",
            "GPU settings edra changed or restored (compute mode through NVML, time-slice through nvidia-smi), by outcome",
            None,
            c.metric_type(),
        )?;
        for (setting, outcome, n) in self.0.snapshot() {
            let labels = [("setting", setting.to_string()), ("outcome", outcome.to_string())];
            ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Encodes the MPS daemon counts at scrape time.
#[derive(Debug)]
struct MpsCollector(Arc<crate::gpu::mps::MpsStats>);

impl Collector for MpsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.0;
        let running = i64::try_from(s.running.load(Relaxed)).unwrap_or(i64::MAX);
        gauge(
            &mut encoder,
            "edra_mps_daemons_running",
            "MPS control daemons of prepared claims found running at the last check",
            None,
            running,
        )?;
        counter(
            &mut encoder,
            "edra_mps_daemon_restarts",
            "MPS control daemons started again after they died",
            None,
            s.restarts.load(Relaxed),
        )?;
        let c = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "edra_mps_daemon_starts",
            "MPS control daemon starts, by outcome (ok: answered and took its limits)",
            None,
            c.metric_type(),
        )?;
        for (outcome, n) in [("ok", s.started.load(Relaxed)), ("failed", s.failed.load(Relaxed))] {
            ConstCounter::new(n).encode(family.encode_family(&[("outcome", outcome.to_string())])?)?;
        }
        let ready = ConstCounter::new(s.ready_millis.load(Relaxed) as f64 / 1000.0);
        ready.encode(encoder.encode_descriptor(
            "edra_mps_daemon_ready",
            "Time from starting an MPS control daemon until it answered, summed over the starts that answered (divide by edra_mps_daemon_starts_total{outcome=\"ok\"})",
            Some(&Unit::Seconds),
            ready.metric_type(),
        )?)
    }
}

/// Encodes device health at scrape time.
#[derive(Debug)]
struct HealthCollector {
    inventory: watch::Receiver<Arc<crate::inventory::Inventory>>,
    health: watch::Receiver<Arc<crate::health::HealthSnapshot>>,
}

impl Collector for HealthCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use crate::health::DeviceState;
        let inv = self.inventory.borrow().clone();
        let health = self.health.borrow().clone();
        let now = crate::health::view::unix_secs(std::time::SystemTime::now());
        let g = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(
            "edra_device_health",
            "1 for the device's current health state (healthy, unhealthy, unknown), 0 for the others",
            None,
            g.metric_type(),
        )?;
        for d in &inv.devices {
            let (state, _) = health.device_state(d);
            for s in [DeviceState::Healthy, DeviceState::Unhealthy, DeviceState::Unknown] {
                let labels = [("device", d.name.clone()), ("state", s.as_str().to_string())];
                ConstGauge::new(i64::from(s == state)).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "edra_device_tainted",
            "How long the device has carried a NoSchedule health taint (0 when it has none)",
            Some(&Unit::Seconds),
            g.metric_type(),
        )?;
        for d in &inv.devices {
            let since = health.conditions_of(d).filter(|c| c.fatal).map(|c| c.since).min();
            let seconds = since.map(|s| now.saturating_sub(s).max(0)).unwrap_or(0);
            ConstGauge::new(seconds).encode(family.encode_family(&[("device", d.name.clone())])?)?;
        }
        let c = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "edra_gpu_xids",
            "XIDs NVML reported since edra started, by GPU UUID and XID (ignored ones included)",
            None,
            c.metric_type(),
        )?;
        for ((gpu, xid), n) in &health.xids_seen {
            let labels = [("gpu", gpu.clone()), ("xid", xid.to_string())];
            ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<&Unit>, v: i64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(encoder.encode_descriptor(name, help, unit, g.metric_type())?)
}

fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<&Unit>, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(encoder.encode_descriptor(name, help, unit, c.metric_type())?)
}

/// The registry behind `/metrics`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    /// A registry of `calls`, the state read from `state`, and the build info.
    pub fn new(calls: &CallMetrics, state: StateSources) -> Self {
        let mut r = Registry::default();
        r.register("edra_build", "edra's version; always 1", Info::new([("version", crate::util::VERSION)]));
        for (name, m) in [("prepare", &calls.prepare), ("unprepare", &calls.unprepare)] {
            let method = if name == "prepare" { "NodePrepareResources" } else { "NodeUnprepareResources" };
            r.register(
                format!("edra_{name}_requests"),
                format!("{method} calls by DRAPlugin version and outcome (ok, claim_error, failed)"),
                m.requests.clone(),
            );
            r.register(
                format!("edra_claims_{name}d"),
                format!("Claims answered by {method}, by outcome (ok, error)"),
                m.claims.clone(),
            );
            r.register_with_unit(
                format!("edra_{name}_duration"),
                format!("Time to answer one {method} call"),
                Unit::Seconds,
                m.duration.clone(),
            );
        }
        r.register(
            "edra_registration_refusals",
            "Registration statuses in which the kubelet refused the plugin",
            calls.refusals.clone(),
        );
        r.register_collector(Box::new(StateCollector(state)));
        Metrics { registry: r }
    }

    /// Adds `edra_gpu_setting_changes_total{setting, outcome}` read from `counts`.
    pub fn register_gpu_changes(&mut self, counts: Arc<crate::gpu::ChangeCounts>) {
        self.registry.register_collector(Box::new(GpuChangeCollector(counts)));
    }

    /// Adds the `edra_mps_daemon*` metrics read from `stats`.
    pub fn register_mps(&mut self, stats: Arc<crate::gpu::mps::MpsStats>) {
        self.registry.register_collector(Box::new(MpsCollector(stats)));
    }

    /// Adds the `edra_device_health`, `edra_device_tainted_seconds` and
    /// `edra_gpu_xids_total` metrics, read from the inventory and the health snapshot.
    pub fn register_health(
        &mut self,
        inventory: watch::Receiver<Arc<crate::inventory::Inventory>>,
        health: watch::Receiver<Arc<crate::health::HealthSnapshot>>,
    ) {
        self.registry.register_collector(Box::new(HealthCollector { inventory, health }));
    }

    /// Adds `edra_gpu_shares`, `edra_gpu_memory_shared_bytes`, `edra_gpu_memory_bytes` and
    /// `edra_mig_instances`, read from the inventory, the state store's share lists and
    /// the MIG instances edra recorded.
    pub fn register_gpu_use(
        &mut self,
        inventory: watch::Receiver<Arc<crate::inventory::Inventory>>,
        store: crate::state::Store,
        owned_mig: watch::Receiver<Arc<crate::dynamic_mig::OwnedInstances>>,
    ) {
        let health = store.health();
        self.registry.register_collector(Box::new(GpuUseCollector { inventory, store, owned_mig }));
        self.registry.register_collector(Box::new(StoreCollector(health)));
    }

    /// Every metric in the OpenMetrics text format ([`OPENMETRICS_CONTENT_TYPE`]).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(8 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
