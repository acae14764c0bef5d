//! The harness and suites of `courier-bench`, courier's benchmark tool.
//!
//! The binary (`src/main.rs`) is only the command line. [`harness`] holds the
//! measurement method, statistics, reports, plots, `compare` and the
//! cross-process helpers; [`suites`] holds the registry of suites and child
//! roles, and explains how to add one.
#![deny(unsafe_code)]

pub mod harness;
pub mod suites;
