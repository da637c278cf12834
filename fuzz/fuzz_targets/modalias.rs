//! `modalias` and the `vfio_pci:` aliases of modules.alias (glob matching must stay linear).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = gpupass::inventory::parse_pci_modalias(&text);
    let (table, modalias) = text.split_once('\n').unwrap_or((&text, "pci:v000010DEd00002335sv000010DEsd000018BEbc03sc02i00"));
    let aliases = gpupass::bind::facts::parse_vfio_aliases(table);
    let _ = gpupass::bind::facts::best_variant(&aliases, modalias);
    if let Some((p, s)) = table.split_once(' ') {
        let _ = gpupass::bind::facts::glob_match(p.as_bytes(), s.as_bytes());
    }
});
