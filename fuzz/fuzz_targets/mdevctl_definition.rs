//! mdevctl definition files (`/etc/mdevctl.d/<parent>/<uuid>`): parse, and what parses
//! serializes to something that parses to the same definition.
#![no_main]
use gpupass::mdev::defs::Definition;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(d) = Definition::parse("83b8f4f2-509f-382f-3c1e-e6bfe0fa1001", "0000:00:02.0", &text) {
        let again = Definition::parse(&d.uuid, &d.parent, &d.to_mdevctl_json()).expect("round trip");
        assert_eq!(again.to_mdevctl_json(), d.to_mdevctl_json());
    }
});
