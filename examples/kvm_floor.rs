//! The floor for `gpupass boot` start-up: exec, create a KVM VM, run one `hlt`, exit.
//! `cargo run --release --example boot_bench` compares it with `gpupass boot --emulated`.

fn main() {
    let host = gpupass::host::HostRoot::new(std::env::var_os("GPUPASS_ROOT").unwrap_or_else(|| "/".into()));
    match gpupass::vmm::floor::bare_hlt(&host) {
        Ok(_) => {}
        Err(e) => {
            eprintln!("kvm_floor: {e}");
            std::process::exit(1);
        }
    }
}
