//! Publishing devices as ResourceSlices: [`desired`] computes what should exist (pure),
//! [`plan`] computes the writes that converge the API server (pure), [`machine`] decides
//! when to plan and what to do with the outcome (no I/O), and the [`reconcile`] loop drives
//! it: watches, applies and keeps going, reporting a [`status::PublishStatus`]. [`taints`]
//! turns GPU health into device taints.

pub mod claim_status;
pub mod desired;
pub mod machine;
pub mod plan;
pub mod reconcile;
pub mod report;
pub mod status;
pub mod taints;
