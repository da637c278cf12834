//! The committed fixture hosts (`tests/fixtures/hosts/<name>`, written by `cargo run --example
//! gen_fixtures`) are exactly what the generator writes today: every file with the same bytes,
//! every symlink with the same target, nothing extra on either side. A change to
//! `src/testkit/fixtures.rs` or `src/testkit/hostgen.rs` without regenerating fails here. (`qemu-lab` is not
//! generated: it is a `gpupass snapshot` of the lab's real kernel.)

use crate::util::*;
use std::collections::BTreeMap;
use std::path::Path;

/// Every entry under `root`: relative path -> "file <bytes>", "link <target>" or "dir".
fn tree(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let t = e.file_type().unwrap();
            let v = if t.is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else if t.is_dir() {
                stack.push(p.clone());
                "dir".to_string()
            } else {
                format!("file {:?}", std::fs::read(&p).unwrap())
            };
            out.insert(rel, v);
        }
    }
    out
}

#[test]
fn committed_fixtures_equal_the_generator() {
    let t = tempfile::tempdir().unwrap();
    // What `cargo run --example gen_fixtures DIR` does, through the library.
    for name in gpupass::testkit::fixtures::NAMES {
        let dir = t.path().join(name);
        gpupass::testkit::fixtures::build(name, &dir).unwrap();
        gpupass::host::keep_empty_dirs(&dir).unwrap();
    }
    let mut checked = 0;
    for e in std::fs::read_dir(t.path()).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        let fresh = tree(&t.path().join(&name));
        let committed = tree(&host(&name));
        let missing: Vec<_> = fresh.keys().filter(|k| !committed.contains_key(*k)).collect();
        let extra: Vec<_> = committed.keys().filter(|k| !fresh.contains_key(*k)).collect();
        let differ: Vec<_> = fresh
            .iter()
            .filter(|(k, v)| committed.get(*k).is_some_and(|c| c != *v))
            .map(|(k, _)| k)
            .collect();
        assert!(
            missing.is_empty() && extra.is_empty() && differ.is_empty(),
            "tests/fixtures/hosts/{name} is not what the generator writes (run `cargo run --example gen_fixtures`):\n\
             not committed: {missing:?}\nnot generated: {extra:?}\ndiffering: {differ:?}"
        );
        checked += fresh.len();
    }
    assert!(checked > 1500, "compared only {checked} entries");
}
