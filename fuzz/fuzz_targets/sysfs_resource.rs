//! sysfs `resource`: never panic; every BAR has a size and a plausible index.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (bars, _errs) = gpupass::inventory::parse_resource(&text);
    for b in bars {
        assert!(b.size >= 1);
        assert!(b.start.checked_add(b.size - 1).is_some());
    }
});
