//! courier: message passing for Rust programs split across fibers, threads and processes.
//!
//! | reach | module | blocks |
//! | --- | --- | --- |
//! | process to process | [`ipc`] | the thread |
//! | thread to thread | [`chan`] | the thread (or a fiber) |
//!
//! [`buf`] is the scatter-gather iterator every transfer goes through.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod buf;
pub mod chan;
pub mod ipc;
mod sync;
