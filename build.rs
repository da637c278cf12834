//! Builds the guest firmware (`firmware/`) into a flat binary in OUT_DIR, and the tiny test
//! guests of `firmware/tests/` next to it (used by tests/it/boot.rs and the floor benchmark).
//!
//! GNU as and gcc (through the `cc` crate, so `CC` is honoured) compile the sources as
//! freestanding code (the firmware as 64-bit code: its entry switches real mode -> protected
//! mode -> long mode; the test guests as 32-bit code); the same compiler driver links them
//! straight to a flat binary (`--oformat=binary`, load address 0x1000), so neither objcopy nor
//! a 32-bit libc is needed.
//! `src/vmm/mod.rs` embeds `firmware.bin`. The firmware's `protocol.h` (layout, ports, marks,
//! struct boot_info) is generated here into OUT_DIR/fw from `src/vmm/protocol.rs`, the one
//! source the VMM compiles too.
//!
//! It also compiles proto/deviceplugin/v1beta1/api.proto (the kubelet device-plugin API) with
//! protox, a pure-Rust protobuf compiler, so no `protoc` is needed; tonic-prost-build generates
//! the messages and both the client and server stubs into OUT_DIR (`src/containers/deviceplugin`).
//!
//! With `dra` it also compiles the kubelet's own DRA protos (proto/pluginregistration/v1,
//! proto/dra/v1, proto/dra/v1beta1, proto/dra-health/v1: copied unchanged from k8s.io/kubelet
//! v0.37.2, proto/KUBELET-DRA.md) the same way (`src/containers/dra`).
//!
//! Each half runs only with its cargo feature (docs/ARCHITECTURE.md, "Features"): the
//! firmware and test guests with `vmm`, the proto compile with `deviceplugin` (and `dra`); a
//! build without either (`--no-default-features`) needs neither gcc nor the proto.

use std::path::{Path, PathBuf};
use std::process::Command;

const TEST_GUESTS: &[&str] = &["halt", "spin", "status", "triple"];

/// The firmware interface, shared with the crate (`vmm::protocol`).
#[allow(dead_code)]
mod protocol {
    include!("src/vmm/protocol.rs");
}

/// `long_mode`: the firmware (64-bit code after its mode switches); else 32-bit test guests.
fn base_build(long_mode: bool, generated: &Path) -> cc::Build {
    let mut b = cc::Build::new();
    if long_mode {
        b.flag("-m64").flag("-march=x86-64").flag("-mno-red-zone");
    } else {
        b.flag("-m32").flag("-march=i686");
    }
    b.include(generated)
        .include("firmware")
        .cargo_metadata(false)
        .opt_level_str("2")
        .debug(false)
        .pic(false)
        .warnings(true)
        .extra_warnings(true)
        .flag("-mgeneral-regs-only")
        .flag("-ffreestanding")
        .flag("-fno-builtin")
        .flag("-fno-stack-protector")
        .flag("-fno-asynchronous-unwind-tables")
        .flag("-fno-pie")
        .flag("-std=gnu11");
    b
}

/// Link `objects` into the flat binary `out` with the compiler driver.
fn link(build: &cc::Build, long_mode: bool, objects: &[PathBuf], layout: &[&str], out: &Path) {
    // Only the compiler's path: cc's default flags (-fPIC...) must not reach this link.
    let status = Command::new(build.get_compiler().path())
        .arg(if long_mode { "-m64" } else { "-m32" })
        .args(["-nostdlib", "-static", "-no-pie"])
        .args(layout)
        .arg("-Wl,--oformat=binary")
        .arg("-Wl,--build-id=none")
        .arg("-o")
        .arg(out)
        .args(objects)
        .status()
        .expect("running the C compiler to link the firmware (is gcc installed?)");
    assert!(status.success(), "linking {} failed: {status}", out.display());
}

/// The kubelet device-plugin API: messages, client and server stubs.
fn compile_protos() {
    let proto = "proto/deviceplugin/v1beta1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"]).unwrap_or_else(|e| panic!("{proto}: {e}"));
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating code for {proto}: {e}"));
}

/// The kubelet's plugin registration, DRA (v1, v1beta1) and DRA health (v1) APIs: messages and
/// both stubs (the client side serves the tests, which play the kubelet).
fn compile_dra_protos() {
    const PROTOS: [&str; 4] = [
        "proto/pluginregistration/v1/api.proto",
        "proto/dra/v1/api.proto",
        "proto/dra/v1beta1/api.proto",
        "proto/dra-health/v1/api.proto",
    ];
    for p in PROTOS {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(PROTOS, ["proto"]).unwrap_or_else(|e| panic!("the DRA protos: {e}"));
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating code for the DRA protos: {e}"));
}

/// Whether cargo builds the crate with `feature` (it sets `CARGO_FEATURE_<NAME>` for build.rs).
fn feature(name: &str) -> bool {
    std::env::var_os(format!("CARGO_FEATURE_{}", name.to_ascii_uppercase())).is_some()
}

fn main() {
    // Without either feature nothing below prints a rerun-if-changed line, and cargo would
    // rerun this script on every change in the package.
    println!("cargo:rerun-if-changed=build.rs");
    write_pci_ids();
    if feature("deviceplugin") {
        compile_protos();
    }
    if feature("dra") {
        compile_dra_protos();
    }
    if feature("vmm") {
        build_firmware();
    }
}

/// The firmware (`firmware.bin`) and the test guests (`test-*.bin`) into OUT_DIR.
fn build_firmware() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for f in ["entry.S", "main.c", "firmware.ld"] {
        println!("cargo:rerun-if-changed=firmware/{f}");
    }
    println!("cargo:rerun-if-changed=src/vmm/protocol.rs");
    let generated = out.join("fw");
    std::fs::create_dir_all(&generated).expect("creating OUT_DIR/fw");
    std::fs::write(generated.join("protocol.h"), protocol::c_header())
        .expect("writing the firmware's protocol.h");
    let mut fw = base_build(true, &generated);
    fw.file("firmware/entry.S").file("firmware/main.c");
    let objects = fw.compile_intermediates();
    link(
        &fw,
        true,
        &objects,
        &["-Wl,-T,firmware/firmware.ld"],
        &out.join("firmware.bin"),
    );

    for name in TEST_GUESTS {
        let src = format!("firmware/tests/{name}.S");
        println!("cargo:rerun-if-changed={src}");
        let mut b = base_build(false, &generated);
        b.file(&src);
        let objects = b.compile_intermediates();
        link(
            &b,
            false,
            &objects,
            &["-Wl,-Ttext=0x1000", "-Wl,-e,_start"],
            &out.join(format!("test-{name}.bin")),
        );
    }
}

/// The pci.ids names as tables that need no relocation at start-up (src/inventory/pciids.rs
/// reads them and describes the format): the `pci-ids` crate's database, walked once here.
fn write_pci_ids() {
    use std::collections::HashMap;
    let mut names: Vec<u8> = Vec::new();
    let mut seen: HashMap<&'static str, u32> = HashMap::new();
    let mut name = |s: &'static str| -> u32 {
        *seen.entry(s).or_insert_with(|| {
            assert!(
                s.len() < 256 && names.len() < 1 << 24,
                "pci.ids name too long: {s:?}"
            );
            let packed = (names.len() as u32) << 8 | s.len() as u32;
            names.extend_from_slice(s.as_bytes());
            packed
        })
    };
    let mut vendors: Vec<&pci_ids::Vendor> = pci_ids::Vendors::iter().collect();
    vendors.sort_by_key(|v| v.id());
    let (mut v_rec, mut d_rec, mut s_rec) = (Vec::new(), Vec::new(), Vec::new());
    let (mut nd, mut ns) = (0u32, 0u32);
    for v in &vendors {
        v_rec.extend_from_slice(&v.id().to_le_bytes());
        v_rec.extend_from_slice(&name(v.name()).to_le_bytes());
        let mut devices: Vec<&pci_ids::Device> = v.devices().collect();
        devices.sort_by_key(|d| d.id());
        for d in devices {
            let first = ns;
            for s in d.subsystems() {
                s_rec.extend_from_slice(&s.subvendor().to_le_bytes());
                s_rec.extend_from_slice(&s.subdevice().to_le_bytes());
                s_rec.extend_from_slice(&name(s.name()).to_le_bytes());
                ns += 1;
            }
            d_rec.extend_from_slice(&v.id().to_le_bytes());
            d_rec.extend_from_slice(&d.id().to_le_bytes());
            d_rec.extend_from_slice(&name(d.name()).to_le_bytes());
            d_rec.extend_from_slice(&first.to_le_bytes());
            d_rec.extend_from_slice(&(ns - first).to_le_bytes());
            nd += 1;
        }
    }
    let mut classes: Vec<&pci_ids::Class> = pci_ids::Classes::iter().collect();
    classes.sort_by_key(|c| c.id());
    let (mut c_rec, mut sc_rec, mut nsc) = (Vec::new(), Vec::new(), 0u32);
    for c in &classes {
        c_rec.push(c.id());
        c_rec.extend_from_slice(&name(c.name()).to_le_bytes());
        let mut subs: Vec<&pci_ids::Subclass> = c.subclasses().collect();
        subs.sort_by_key(|s| s.id());
        for s in subs {
            sc_rec.extend_from_slice(&[c.id(), s.id()]);
            sc_rec.extend_from_slice(&name(s.name()).to_le_bytes());
            nsc += 1;
        }
    }
    let mut db = Vec::new();
    for n in [vendors.len() as u32, nd, ns, classes.len() as u32, nsc] {
        db.extend_from_slice(&n.to_le_bytes());
    }
    for part in [&v_rec, &d_rec, &s_rec, &c_rec, &sc_rec, &names] {
        db.extend_from_slice(part);
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap()).join("pci_ids.bin");
    std::fs::write(out, db).unwrap();
}
