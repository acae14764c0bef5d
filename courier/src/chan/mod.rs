//! In-process channels (seed 003).
