//! glibc's `/etc/ld.so.cache` (binary, written by ldconfig): `gpupass container list` reads it.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(entries) = gpupass::inventory::native::ldcache::parse(data) {
        // What parses writes back to something that parses to the same entries.
        let again =
            gpupass::inventory::native::ldcache::parse(&gpupass::inventory::native::ldcache::write(&entries))
                .expect("round trip");
        assert_eq!(again.len(), entries.len());
    }
});
