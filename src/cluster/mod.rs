//! The cluster layer: what a node knows of the other nodes, through the coordination seam
//! ([`crate::coord`]). A single node runs it too, on the in-process coordination store, so one
//! code path serves both.
//!
//! [`membership`] (each node registered under its session, with its bookie address and whether
//! it is stopping; the live nodes read from [`roster`], a watch-fed copy of the registrations),
//! [`ownership`] (one owner per topic partition, with an epoch that fences earlier owners'
//! ledger creation; placement of unowned topics; planned moves), [`load`] (load reports for the
//! load managers) and [`failure`] (peers whose processes are gone have their sessions ended at
//! once). Replicated ledgers, bookie-side fencing and recovery live in [`crate::bookie`].

pub mod failure;
pub mod load;
pub mod membership;
pub mod ownership;
pub mod roster;
