//! The data packet's header: any 40 bytes decode to a header that encodes
//! back to them, or to a typed error.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| courier::ipc::fuzz::header(bytes));
