//! The job: the command's process, its guard, and the raw system calls they use.
//!
//! Nothing here talks to Redis; the watchdog tells the job when to stop.

pub mod capture;
pub mod cgroup;
pub mod child;
pub mod guard;
pub mod shared;
pub mod signals;
pub mod supervise;
pub mod sys;
pub mod tree;
