//! glibc's `/etc/ld.so.cache` (binary, written by ldconfig): `gpupass container list` reads it.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(entries) = gpupass::container::ldcache::parse(data) {
        // What parses writes back to something that parses to the same entries.
        let again = gpupass::container::ldcache::parse(&gpupass::container::ldcache::write(&entries)).expect("round trip");
        assert_eq!(again.len(), entries.len());
    }
});
