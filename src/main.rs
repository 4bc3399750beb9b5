//! The `cronlock` binary: everything lives in the library so tests and doc generators share it.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(cronlock::run())
}
