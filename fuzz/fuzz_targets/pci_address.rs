//! PCI addresses from the command line: never panic; what parses prints back to itself.
#![no_main]
use gpupass::model::PciAddress;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(a) = s.parse::<PciAddress>() {
        let printed = a.to_string();
        assert_eq!(printed.parse::<PciAddress>().unwrap(), a);
    }
});
