//! The Linux transport: system calls only.
#![allow(unsafe_code)]

pub(crate) mod futex;
pub(crate) mod memfd;
pub(crate) mod poller;
pub(crate) mod random;
pub(crate) mod socket;
