//! Kernel uevent datagrams from the netlink socket.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ev) = gpupass::host::uevents::parse_uevent(data) {
        let _ = ev.is_relevant();
        let _ = ev.line();
    }
});
