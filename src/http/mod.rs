//! `--listen ADDR`: a replica a platform can watch. A small read-only HTTP/1.1 server on a thread
//! of its own (`http.rs`) serves `/metrics` (`exposition.rs`), `/healthz` and `/readyz`
//! (`probes.rs`) and a status page `/` (`page.rs`), each an [`answer::Response`], from the
//! [`Board`] (`board.rs`): what the replica's loop and claims thread saw, written there as typed
//! values, and, for the fleet-wide state (the ledger, a suspension), a bounded read of Redis per
//! request on links of its own (`fleet.rs`). The server only reads the board: it can never hold
//! the scheduler up.

mod answer;
mod board;
mod exposition;
mod fleet;
mod page;
mod probes;
mod request;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use anyhow::{anyhow, Result};

use crate::log::Log;

pub use board::{Board, BoardState, Failed, Fleetwide, JobLine, Running};

/// Bind `addr` and serve the board there, on a thread of its own (bad requests said at `-v`).
/// `show_output` (`--show-output`): the page shows each job's last failure's kept output.
pub fn start(addr: SocketAddr, board: Arc<Board>, log: Log, show_output: bool) -> Result<()> {
    let listener = TcpListener::bind(addr).map_err(|e| {
        anyhow!(
            "--listen {addr}: cannot listen there: {}",
            crate::log::io_text(&e)
        )
    })?;
    std::thread::Builder::new()
        .name("listen".into())
        .spawn(move || request::serve(listener, &board, &log, show_output))
        .map_err(|e| anyhow!("--listen {addr}: cannot start its thread: {e}"))?;
    Ok(())
}
