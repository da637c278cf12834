//! Regenerate the shipped fixture hosts: `cargo run --example gen_fixtures [DIR]`
//! (default `tests/fixtures/hosts`). The `qemu-lab` host is not generated: it is captured from
//! the lab's real kernel with `gpupass snapshot`.
use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let base = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("tests/fixtures/hosts"));
    for name in gpupass::testkit::fixtures::NAMES {
        let dir = base.join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        gpupass::testkit::fixtures::build(name, &dir)?;
        gpupass::host::keep_empty_dirs(&dir)?;
        println!("wrote {}", dir.display());
    }
    Ok(())
}
