//! The job: the command's process, its guard, the loop that supervises it, and the raw system
//! calls the guard and the pre-exec code use.
//!
//! May not: talk to Redis (the watchdog tells the job when to stop), or use anything but
//! [`sys`] in the guard and between `clone` and `execve`.

pub mod capture;
pub mod cgroup;
pub mod child;
pub mod guard;
pub mod kept;
pub mod oversight;
pub mod process;
pub mod shared;
pub mod supervise;
pub mod sys;
pub mod tree;
