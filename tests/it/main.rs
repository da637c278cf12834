//! The integration tests: one test binary (`cargo test --test it`), one module per area, so the
//! library and the helpers in [`util`] are linked once instead of once per file. Test names are
//! module paths (`bind::...`, `errors::e_bind_07`, `lab::leg_6_1::smoke`); run one area with
//! `cargo test --test it bind::` (docs/testing.md). The data the tests read stays beside them:
//! `tests/fixtures`, `tests/golden`, `tests/schemas`.
//!
//! Every `tests/it/*.rs` file must be a `mod` below (a file that is not is never compiled, so
//! its tests would silently not run); `every_test_file_is_a_module` checks that.

mod util;

mod bind;
mod boot;
mod cdi_validate;
mod change;
mod concurrency;
mod containers;
mod deploy;
mod deviceplugin;
/// Needs the `dra` feature: `cargo test --features dra --test it dra::`.
#[cfg(feature = "dra")]
mod dra;
mod errors;
mod everyday;
mod fixtures_current;
mod gotool;
mod hostile;
mod inventory;
mod lab;
/// The lab's judges (also `lab/judge`, the program lab/lab.sh runs).
mod labjudge;
mod labqemu;
mod labtool;
mod mdev;
mod oci_hook;
mod package;
mod refresh;
/// Needs libvirt's client library: `cargo test --features libvirt --test it vm_attach::`.
#[cfg(feature = "libvirt")]
mod vm_attach;
mod vm_outputs;

/// Each `tests/it/*.rs` is a module of this binary, and `tests/` itself holds no `*.rs` (cargo
/// would build each as a binary of its own: `autotests = false` in Cargo.toml turns that off,
/// so such a file would not run at all).
#[test]
fn every_test_file_is_a_module() {
    let dir = util::manifest_dir().join("tests");
    let stray: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs"))
        .collect();
    assert!(
        stray.is_empty(),
        "tests/ holds {stray:?}: move them to tests/it/ as modules"
    );
    let main = include_str!("main.rs");
    let mut missing = Vec::new();
    let mut files = 0;
    for e in std::fs::read_dir(dir.join("it")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(module) = name.strip_suffix(".rs") else {
            continue;
        };
        files += 1;
        if module != "main" && !main.lines().any(|l| l == format!("mod {module};")) {
            missing.push(name);
        }
    }
    assert!(files > 10, "only {files} files in tests/it");
    assert!(
        missing.is_empty(),
        "tests/it/{missing:?} not declared as `mod` in tests/it/main.rs"
    );
}
