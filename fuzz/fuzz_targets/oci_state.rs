//! What the OCI hook reads from a runtime: the state document on stdin, the device annotation
//! (from the state or `config.json`) and the container's `/proc/<pid>/cgroup`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<gpupass::containers::oci_hook::State>(data);
    let text = String::from_utf8_lossy(data);
    if let Ok(config) = serde_json::from_str::<serde_json::Value>(&text) {
        if let Some(v) = config["annotations"]["gpupass.dev/devices"].as_str() {
            let _ = gpupass::containers::oci_hook::parse_request(v);
        }
    }
    let _ = gpupass::containers::oci_hook::parse_request(&text);
    let _ = gpupass::containers::oci_hook::device_cgroup(&text);
});
