//! The descriptor packet: any bytes decode to a packet that encodes back to
//! them, or to a typed error.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| courier::ipc::fuzz::fd_packet(bytes));
