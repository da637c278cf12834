//! Every CDI spec gpupass generates, on every fixture host and with every `--backend`, is loaded
//! by the reference implementation, `tags.cncf.io/container-device-interface` v1.1.2 (the library
//! containerd, podman and CRI-O load specs with), through the small helper in
//! `tests/cdi-validate` (`cdi.ReadSpec`, then a `cdi.Cache` over the spec alone). The helper is
//! built on first use into the test target directory with the go that `lab/tools/go.sh` finds
//! or fetches (Go 1.26: tests/install-deps.sh has run it already); when it can have none the
//! tests fail under `CI=true` and say SKIPPED elsewhere.

use crate::util::*;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The prefix of [`go`]'s error: no Go 1.26 could be had (SKIPPED outside CI).
pub(crate) const NO_GO: &str = "no Go 1.26";

/// The go command every Go build of the project uses: `lab/tools/go.sh` (Go 1.26 or newer from
/// `$GO`, PATH or /usr/local/go, else go1.26.8 fetched from the Go module proxy into the lab
/// cache); `Err` starts with [`NO_GO`] and carries the script's message.
pub(crate) fn go() -> Result<PathBuf, String> {
    let o = Command::new(manifest_dir().join("lab/tools/go.sh"))
        .output()
        .map_err(|e| format!("{NO_GO}: lab/tools/go.sh: {e}"))?;
    if !o.status.success() {
        return Err(format!("{NO_GO}: lab/tools/go.sh: {}", stderr(&o).trim()));
    }
    Ok(PathBuf::from(stdout(&o).trim()))
}

/// The helper binary, built once per test run; `Err` says why it could not be.
fn helper() -> &'static Result<PathBuf, String> {
    static HELPER: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    HELPER.get_or_init(|| {
        let go = go()?;
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cdi-validate");
        let tmp = out.with_extension("tmp");
        let o = Command::new(&go)
            .current_dir(manifest_dir().join("tests/cdi-validate"))
            .args(["build", "-trimpath", "-o"])
            .arg(&tmp)
            .arg(".")
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-mod=readonly")
            .output()
            .map_err(|e| format!("{}: {e}", go.display()))?;
        if !o.status.success() {
            return Err(format!(
                "go build of tests/cdi-validate failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        std::fs::rename(&tmp, &out).map_err(|e| e.to_string())?;
        Ok(out)
    })
}

/// The helper, or None (SKIPPED) when Go is missing outside CI; any other failure panics.
pub(crate) fn need_helper() -> Option<&'static PathBuf> {
    match helper() {
        Ok(p) => Some(p),
        Err(why) if why.starts_with(NO_GO) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{why}: CI must run this test");
            }
            eprintln!("SKIPPED: {why} (mandatory when CI=true)");
            None
        }
        Err(why) => panic!("{why}"),
    }
}

/// Runs the helper on one spec text: Ok(the qualified device names it loaded) or Err(its message).
pub(crate) fn validate(helper: &PathBuf, name: &str, spec: &str) -> Result<Vec<String>, String> {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join(format!("{name}.json"));
    std::fs::write(&f, spec).unwrap();
    let o = Command::new(helper).arg(&f).output().unwrap();
    if !o.status.success() {
        return Err(format!("exit {:?}: {}", o.status.code(), stderr(&o)));
    }
    let line = stdout(&o);
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.first(), Some(&"OK"), "helper said: {line}");
    Ok(fields[4].split(',').map(str::to_string).collect())
}

fn hosts() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(manifest_dir().join("tests/fixtures/hosts"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn every_generated_spec_loads_in_the_reference_cdi_library() {
    let Some(helper) = need_helper() else { return };
    let mut loaded = Vec::new();
    let mut refused = Vec::new();
    for h in hosts() {
        for backend in ["auto", "legacy", "iommufd"] {
            let o = on_host(&h, &["cdi", "generate", "--backend", backend]);
            if !o.status.success() {
                // Nothing to describe, or a backend the host cannot serve: a clean host error.
                assert_eq!(
                    o.status.code(),
                    Some(1),
                    "{h} --backend {backend}: {}",
                    stderr(&o)
                );
                assert!(!stderr(&o).contains("panicked"), "{h} {backend}: {}", stderr(&o));
                refused.push(format!("{h}/{backend}"));
                continue;
            }
            let text = stdout(&o);
            let spec: serde_json::Value = serde_json::from_str(&text).unwrap();
            let names = validate(helper, &format!("{h}-{backend}"), &text)
                .unwrap_or_else(|e| panic!("{h} --backend {backend}: the CDI library rejects the spec: {e}"));
            let kind = spec["kind"].as_str().unwrap();
            let mut want: Vec<String> = spec["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| format!("{kind}={}", d["name"].as_str().unwrap()))
                .collect();
            want.sort();
            let mut got = names.clone();
            got.sort();
            assert_eq!(
                got, want,
                "{h} --backend {backend}: the library lists other devices"
            );
            loaded.push(format!("{h}/{backend}"));
        }
    }
    eprintln!("loaded by the CDI library: {loaded:?}; refused by gpupass (exit 1): {refused:?}");
    // Every fixture host with VFIO or native GPUs gives a spec under auto.
    for &h in crate::containers::HOSTS {
        assert!(
            loaded.contains(&format!("{h}/auto")),
            "{h}/auto did not load: {loaded:?}"
        );
    }
    // Both explicit backends are exercised somewhere.
    assert!(loaded.iter().any(|l| l.ends_with("/legacy")), "{loaded:?}");
    assert!(loaded.iter().any(|l| l.ends_with("/iommufd")), "{loaded:?}");
}

#[test]
fn the_reference_library_check_can_fail() {
    let Some(helper) = need_helper() else { return };
    // An environment entry without '=' and a device name the library refuses.
    for (what, spec) in [
        (
            "env",
            r#"{"cdiVersion":"0.5.0","kind":"gpupass.dev/pci","devices":[{"name":"x","containerEdits":{"env":["NOEQ"]}}]}"#,
        ),
        (
            "name",
            r#"{"cdiVersion":"0.5.0","kind":"gpupass.dev/pci","devices":[{"name":"a b","containerEdits":{"env":["A=1"]}}]}"#,
        ),
        (
            "version",
            r#"{"cdiVersion":"0.3.0","kind":"gpupass.dev/pci","devices":[{"name":"0000:17:00.0","containerEdits":{"env":["A=1"]}}]}"#,
        ),
    ] {
        let e = validate(helper, what, spec).expect_err(what);
        assert!(e.contains("FAIL") && e.contains("exit Some(1)"), "{what}: {e}");
    }
}
