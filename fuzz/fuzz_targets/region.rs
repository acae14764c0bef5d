//! Region copy-out: scripts of raw packets (see `courier_fuzz`) whose seeds
//! are messages in memfd regions (streamed, skewed, named), played into a
//! receiver's socket, with regions a peer wrote. Every
//! message is a value or a typed error, nothing panics, and every
//! descriptor is closed.
#![no_main]

use std::sync::Once;

static CONFIG: Once = Once::new();

libfuzzer_sys::fuzz_target!(|script: &[u8]| {
    CONFIG.call_once(courier_fuzz::configure);
    courier_fuzz::run(script, courier_fuzz::Reader::BytesOrTyped);
});
