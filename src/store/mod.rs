//! The store: everything that talks to Redis.
//!
//! URLs resolve to one [`topology::Redis`] (a server, a Sentinel-named primary, a Cluster) or a
//! [`quorum::Masters`] of several; the lock code asks it one thing: run this script for KEY by this
//! deadline, through [`wire`] (every exchange bounded in time and size).
//!
//! May not: start or stop a process (only [`crate::signals`], so a wait ends on a signal),
//! write reports, or open a connection other than through [`wire`].

pub mod acquire;
pub mod cluster;
pub mod dial;
pub mod durable;
pub mod failure;
pub mod holder;
pub mod inspect;
pub mod keys;
pub mod lock;
pub mod members;
pub mod origin;
pub mod overlap;
pub mod quorum;
pub mod resp;
pub mod round;
pub mod script;
pub mod sentinel;
pub mod tls;
pub mod topology;
pub mod tracking;
pub mod trigger;
pub mod url;
pub mod wait;
pub mod wire;
pub mod wire_error;
