//! The change journal on replay: a torn or garbled journal (crash mid-append) must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = gpupass::change::journal::replay(&text);
});
