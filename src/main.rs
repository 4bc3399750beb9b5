//! The `cronlock` binary: everything lives in the library so tests and doc generators share it.
//!
//! No Rust `main`: [`cronlock::start`] says why, and does the part of the start-up cronlock needs.
#![no_main]

use std::ffi::{c_char, c_int};

#[no_mangle]
pub extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    cronlock::run().into()
}
