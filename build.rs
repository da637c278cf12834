//! Builds the guest firmware (`firmware/`) into a flat binary in OUT_DIR.
//!
//! GNU as and gcc (through the `cc` crate, so `CC` is honoured) compile `entry.S` and
//! `main.c` as 32-bit freestanding code; the same compiler driver links them with
//! `firmware/firmware.ld` straight to a flat binary (`--oformat=binary`), so neither
//! objcopy nor a 32-bit libc is needed. `src/vmm/mod.rs` embeds the result.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for f in ["entry.S", "main.c", "protocol.h", "firmware.ld"] {
        println!("cargo:rerun-if-changed=firmware/{f}");
    }
    let mut build = cc::Build::new();
    build
        .file("firmware/entry.S")
        .file("firmware/main.c")
        .include("firmware")
        .cargo_metadata(false)
        .opt_level_str("s")
        .debug(false)
        .pic(false)
        .warnings(true)
        .extra_warnings(true)
        .flag("-m32")
        .flag("-march=i686")
        .flag("-mgeneral-regs-only")
        .flag("-ffreestanding")
        .flag("-fno-builtin")
        .flag("-fno-stack-protector")
        .flag("-fno-asynchronous-unwind-tables")
        .flag("-fno-pie")
        .flag("-std=gnu11");
    let objects = build.compile_intermediates();
    let bin = out.join("firmware.bin");
    // Only the compiler's path: cc's default flags (-m64, -fPIC...) must not reach this link.
    let status = Command::new(build.get_compiler().path())
        .args(["-m32", "-nostdlib", "-static", "-no-pie"])
        .arg("-Wl,-T,firmware/firmware.ld")
        .arg("-Wl,--oformat=binary")
        .arg("-Wl,--build-id=none")
        .arg("-o")
        .arg(&bin)
        .args(&objects)
        .status()
        .expect("running the C compiler to link the firmware (is gcc installed?)");
    assert!(status.success(), "linking the firmware failed: {status}");
}
