//! `/healthz` and `/readyz`: the replica's liveness (its loop turns) and readiness (Redis answers,
//! it is not draining, it can start runs), from the board.

use super::answer::Response;
use super::board::{Board, STUCK, UNANSWERED};

/// 200 while the loop turns.
pub fn healthz(board: &Board) -> Response {
    let since = board.since_turn();
    if since > STUCK {
        return Response::text(
            503,
            format!(
                "stuck: the replica's loop has not turned for {} ms\n",
                since.as_millis()
            ),
        );
    }
    Response::text(200, "ok\n")
}

/// 200 while Redis answers and the replica serves.
pub fn readyz(board: &Board) -> Response {
    let s = board.state();
    if s.draining {
        return Response::text(503, "draining: this replica claims nothing more\n");
    }
    if let Some(why) = &s.sick {
        return Response::text(503, format!("{why}\n"));
    }
    if let Some(why) = &s.failing {
        return Response::text(503, format!("redis does not answer: {why}\n"));
    }
    match s.answered {
        Some(at) if at.elapsed() <= UNANSWERED.max(s.beat_every * 5 / 2) => {
            Response::text(200, "ready\n")
        }
        Some(at) => Response::text(
            503,
            format!(
                "redis has not answered for {} ms\n",
                at.elapsed().as_millis()
            ),
        ),
        None => Response::text(503, "not yet: redis has not answered a heartbeat yet\n"),
    }
}
