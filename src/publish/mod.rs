//! Publishing devices as ResourceSlices: [`desired`] computes what should exist (pure);
//! the reconcile loop makes the API server match it.

pub mod desired;
