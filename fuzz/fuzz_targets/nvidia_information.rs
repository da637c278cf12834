//! `/proc/driver/nvidia/gpus/<addr>/information` and `nvidia/creatable_vgpu_types`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = gpupass::inventory::parse_nvidia_information(&text);
    for t in gpupass::inventory::parse_creatable_vgpu_types(&text) {
        assert!(!t.id.is_empty());
    }
});
