//! Test doubles and helpers shared by the integration tests and the benchmarks.
#![allow(dead_code)]

pub mod agent;
pub mod apiserver;
#[path = "../../../src/test_support/captured_logs.rs"]
pub mod captured_logs;
#[path = "../../../src/test_support/cc.rs"]
pub mod cc;
pub mod inotify;
pub mod kubelet;
pub mod layout;
pub mod mps;
pub mod nvidia_smi;
pub mod nvml;
pub mod procfs;
pub mod systemd;
#[path = "../../../src/test_support/tegra.rs"]
pub mod tegra;
