//! Publishing devices as ResourceSlices: [`desired`] computes what should exist (pure),
//! [`plan`] computes the writes that converge the API server (pure), and the reconcile
//! loop applies them and keeps watching.

pub mod desired;
pub mod plan;
pub mod reconcile;
