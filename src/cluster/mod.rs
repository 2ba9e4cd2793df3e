//! The cluster layer: what a node knows of the other nodes, through the coordination seam
//! ([`crate::coord`]). A single node runs it too, on the in-process coordination store, so one
//! code path serves both.
//!
//! Built so far: [`membership`] (each node registered under its session; the live nodes
//! listed) and [`ownership`] (one owner per topic partition, with an epoch; placement of
//! unowned topics). Replicated ledgers, fencing and handoff are issue 19's later slices.

pub mod membership;
pub mod ownership;
