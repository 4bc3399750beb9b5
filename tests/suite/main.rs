//! The integration tests, one binary: each module is a suite that runs the real binary (the
//! release build `scripts/test.sh` names in `CRONLOCK_TEST_BIN`) against real servers it starts;
//! `common/` is their support. One binary, so the support compiles once and every suite's tests
//! share one pool of test threads. A suite is selected by its name as a filter
//! (`cargo test --test suite -- catchup::`).

mod common;

mod accounted;
mod catchup;
mod claims;
mod cluster;
mod crontab;
mod docs;
mod dst;
mod edges;
mod examples;
mod fleet;
mod gone;
mod guard;
mod hostile;
mod layers;
mod lifecycle;
mod listen;
mod locking;
mod monitoring;
mod newcomer;
mod output;
mod owner;
mod policies;
mod quorum;
mod records;
mod replicated;
mod report;
mod safety;
mod schedule;
mod secrets;
mod semaphore;
mod ship;
mod stalls;
mod timing;
mod tls;
mod tracking;
