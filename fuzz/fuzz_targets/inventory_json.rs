//! Saved inventories given to `--from-json` (attached to bug reports, edited by hand).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(inv) = serde_json::from_slice::<gpupass::model::Inventory>(data) {
        let _ = gpupass::output::table::groups(&inv);
        let devs: Vec<_> = inv.devices.iter().collect();
        let _ = gpupass::output::table::list(&inv, &devs);
    }
});
