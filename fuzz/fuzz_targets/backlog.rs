//! A moved receiver's backlog: scripts of raw packets (see `courier_fuzz`)
//! whose seeds send a receiver that had read messages (some waiting for
//! their descriptors) and held regions; each receiver that arrives is
//! drained. Every message is a value or a typed error, nothing panics, and
//! every descriptor is closed.
#![no_main]

use std::sync::Once;

static CONFIG: Once = Once::new();

libfuzzer_sys::fuzz_target!(|script: &[u8]| {
    CONFIG.call_once(courier_fuzz::configure);
    courier_fuzz::run(script, courier_fuzz::Reader::Moved);
});
