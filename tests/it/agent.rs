//! End-to-end tests of the assembled agent (`edra::app::run`, and `edra run` as a child
//! process): publishing against the test API server with the node authorizer, claim
//! preparation through the kubelet's gRPC API, offline operation, and crash consistency
//! at every failpoint of prepare and unprepare. The harness is `support::agent`.

mod claim_status;
mod crash;
mod crash_mig;
mod crash_release;
mod diskfull;
mod exits;
mod handover;
mod health;
mod jetson;
mod kept_sockets;
mod logs;
mod memory_limit_sums;
pub(crate) mod memory_limits;
mod mig;
mod mig_publishing;
mod misbehaving;
mod node_user;
mod offline;
mod pool;
mod prefetch;
mod preparing;
mod publishing;
mod shares;
mod sharing;
mod single;
mod stale;
mod status;
