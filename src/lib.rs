//! edra: a Kubernetes Dynamic Resource Allocation (DRA) driver for GPUs, built for small
//! edge clusters (k3s, air-gapped sites, hosts run with packages and systemd).
//!
//! The binary (`src/main.rs`) is thin; everything lives in this library so integration
//! tests and benchmarks can drive the same code in-process:
//!
//! - [`cli`]: the command line: subcommands, flags and how flags become configuration.
//! - [`config`]: the TOML file, `EDRA_*` environment and flags, validated all at once.
//! - [`kube`]: the Kubernetes API client on hyper + rustls (kubeconfig, in-cluster, watch).
//! - [`inventory`]: the device model and its backends (NVML, mock).
//! - [`publish`]: desired ResourceSlices (pure) and the loop that keeps them published.
//! - [`plugin`]: the kubelet's gRPC APIs on Unix sockets (registration, DRAPlugin).
//! - [`prepare`]: claim preparation: opaque configs, CDI specs, driver files.
//! - [`gpu`]: actuators with side effects on a GPU (compute mode, time-slice, MPS daemons,
//!   MIG instances).
//! - [`sharing`]: how full GPUs are offered: whole, as memory shares, or as replicas.
//! - [`dynamic_mig`]: dynamic MIG: which GPUs are carved on demand and what they publish.
//! - [`health`]: GPU health from NVML events and probes: conditions that become taints.
//! - [`device_config`]: the opaque `GpuConfig` model, shared by prepare and state.
//! - [`state`]: node-local allocation state in sled, durable and schema-versioned.
//! - [`doctor`]: `edra doctor`, node and cluster checks that say what to fix.
//! - [`status`]: `edra status`, the running agent's view of its node on a root-only socket.
//! - [`selftest`]: `edra selftest`, the node path on this node's GPUs without a cluster.
//! - [`hook`]: the OCI hooks the CDI specs call (`edra hook ...`).
//! - [`telemetry`]: logging, Prometheus metrics, `/healthz` and `/readyz`.
//! - [`app`]: wiring, task supervision and shutdown for `edra run`.
//! - [`node_lock`]: the lock files that keep a second agent off the node.
//! - [`handover`]: the kubelet's listening sockets passed from a running agent to a newer one.
//! - [`dirmode`]: the directories edra uses that others could write in.
//! - [`malloc`]: glibc allocator settings for the long-running agent.
//! - [`failpoint`]: crash points of prepare and unprepare for crash-consistency tests.
//! - [`util`]: the version and error rendering every layer shares; imports nothing of edra.
//! - `fuzzing`: the library functions the fuzz targets and property tests drive (hidden).

pub mod app;
pub mod cli;
pub mod config;
pub mod device_config;
pub mod dirmode;
pub mod doctor;
pub mod dynamic_mig;
pub mod failpoint;
#[doc(hidden)]
pub mod fuzzing;
pub mod gpu;
pub mod handover;
pub mod health;
pub mod hook;
pub mod inventory;
pub mod kube;
pub mod malloc;
pub mod node_lock;
pub mod plugin;
pub mod prepare;
pub mod publish;
pub mod selftest;
pub mod sharing;
pub mod state;
pub mod status;
pub mod telemetry;
pub mod util;

#[cfg(test)]
mod test_support;

/// edra's version (see [`util::VERSION`]).
pub use util::VERSION;
