//! `lab/tools/go.sh`, the one place every Go build of the project (lab/cluster/build.sh, the
//! helpers of tests/it/cdi_validate.rs and tests/it/dra.rs) and tests/install-deps.sh get their
//! go command from: Go 1.26 or newer where the machine has one, else go1.26.8 fetched from the
//! Go module proxy and checked against the checksum database's hash, else a stop saying what to
//! install. Run as the README's test command meets it: with an old go first on PATH (a stand-in
//! printing Debian 12's `go version go1.19.8 linux/amd64`) or none, the real script, the real
//! toolchain zip, a scratch cache.

use crate::util::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ZIP: &str = "goproxy/golang.org/toolchain/@v/v0.0.1-go1.26.8.linux-amd64.zip";

/// A directory holding only a `go` that says it is `version` (as `go version` prints it).
fn fake_go(dir: &Path, version: &str) -> PathBuf {
    let bin = dir.join("fakebin");
    std::fs::create_dir_all(&bin).unwrap();
    let go = bin.join("go");
    std::fs::write(
        &go,
        format!("#!/bin/sh\necho 'go version {version} linux/amd64'\n"),
    )
    .unwrap();
    std::fs::set_permissions(&go, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// lab/tools/go.sh with `PATH` = `first` (if any), /usr/bin, /bin; no `GO`; /usr/local/go
/// hidden (`GPUPASS_GO_INSTALLED` names nothing); `cache` as the lab cache; `proxy` as GOPROXY.
fn go_sh(first: Option<&Path>, cache: &Path, proxy: &str) -> Output {
    let path = match first {
        Some(d) => format!("{}:/usr/bin:/bin", d.display()),
        None => "/usr/bin:/bin".to_string(),
    };
    Command::new(manifest_dir().join("lab/tools/go.sh"))
        .env("PATH", path)
        .env_remove("GO")
        .env("GPUPASS_GO_INSTALLED", "/nonexistent/go/bin/go")
        .env("GPUPASS_LAB_CACHE", cache)
        .env("GOPROXY", proxy)
        .output()
        .unwrap()
}

fn lab_cache() -> PathBuf {
    std::env::var_os("GPUPASS_LAB_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/gpupass-lab"))
}

/// The go1.26.8 toolchain zip as a file:// proxy tree. The first run on a machine fetches it
/// for real, with no go on PATH (the script's network path: proxy.golang.org or GOPROXY), into
/// a scratch cache, and keeps the zip in the lab cache so later runs need no network.
fn toolchain_proxy() -> PathBuf {
    let cache = lab_cache();
    if !cache.join(ZIP).exists() {
        let scratch = tempfile::tempdir().unwrap();
        let proxy = std::env::var("GOPROXY").unwrap_or_else(|_| "https://proxy.golang.org,direct".into());
        let o = go_sh(None, scratch.path(), &proxy);
        assert!(
            o.status.success(),
            "fetching go1.26.8 with no go at all: {}",
            stderr(&o)
        );
        let go = PathBuf::from(stdout(&o).trim());
        assert_eq!(go, scratch.path().join("go1.26.8/go/bin/go"));
        let v = Command::new(&go).arg("version").output().unwrap();
        assert!(
            stdout(&v).starts_with("go version go1.26.8 linux/amd64"),
            "{}",
            stdout(&v)
        );
        let keep = cache.join(ZIP);
        std::fs::create_dir_all(keep.parent().unwrap()).unwrap();
        let part = keep.with_extension("copy");
        std::fs::copy(scratch.path().join(ZIP), &part).unwrap();
        std::fs::rename(&part, &keep).unwrap();
    }
    cache.join("goproxy")
}

/// Debian 12's go 1.19 first on PATH and no other go: the script passes it over, fetches
/// go1.26.8 (the real zip, through a file:// proxy), checks it, unpacks it, and the go it prints
/// runs and builds; the next run finds it in the cache without fetching.
#[test]
fn an_old_go_is_passed_over_and_go1_26_is_fetched() {
    let proxy = format!("file://{}", toolchain_proxy().display());
    let t = tempfile::tempdir().unwrap();
    let old = fake_go(t.path(), "go1.19.8");
    let cache = t.path().join("cache");
    let o = go_sh(Some(&old), &cache, &proxy);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let go = PathBuf::from(stdout(&o).trim());
    assert_eq!(go, cache.join("go1.26.8/go/bin/go"));
    assert!(
        err.contains(&format!("no Go 1.26: found {}/go (go1.19.8)", old.display()))
            && err.contains("fetching go1.26.8 from file://"),
        "{err}"
    );
    let v = Command::new(&go)
        .args(["env", "GOVERSION", "GOROOT"])
        .env("GOTOOLCHAIN", "local")
        .output()
        .unwrap();
    assert_eq!(
        stdout(&v),
        format!("go1.26.8\n{}\n", cache.join("go1.26.8/go").display()),
        "{}",
        stderr(&v)
    );
    // It compiles and links (its tools got their execute bits): a program with no module.
    let src = t.path().join("hello.go");
    std::fs::write(
        &src,
        "package main\n\nfunc main() { println(\"hello from go1.26.8\") }\n",
    )
    .unwrap();
    let b = Command::new(&go)
        .args(["run", src.to_str().unwrap()])
        .env("GOCACHE", t.path().join("gocache"))
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "")
        .output()
        .unwrap();
    assert!(stderr(&b).contains("hello from go1.26.8"), "{}", stderr(&b));
    // Cached: found, nothing fetched, nothing said.
    let again = go_sh(Some(&old), &cache, "off");
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(PathBuf::from(stdout(&again).trim()), go);
    assert_eq!(stderr(&again), "");
}

/// With no proxy to fetch from (GOPROXY=off) the script stops at once, naming the go it found
/// and what to install; nothing lands in the cache.
#[test]
fn without_a_proxy_it_stops_at_once_saying_what_to_install() {
    let t = tempfile::tempdir().unwrap();
    let old = fake_go(t.path(), "go1.19.8");
    let cache = t.path().join("cache");
    let started = std::time::Instant::now();
    let o = go_sh(Some(&old), &cache, "off");
    let took = started.elapsed();
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert_eq!(stdout(&o), "");
    let err = stderr(&o);
    let found = format!("no Go 1.26: found {}/go (go1.19.8)", old.display());
    for part in [
        found.as_str(),
        "GOPROXY=off gives no proxy URL",
        "install Go 1.26 or newer from https://go.dev/dl/",
        "set GO=/path/to/go",
        "Debian 12's golang-go is 1.19",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    assert!(took < std::time::Duration::from_secs(10), "took {took:?}");
    assert!(!cache.join("go1.26.8").exists());
    // No go at all: the same stop, saying none was found.
    let o = go_sh(None, &cache, "off");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no go on PATH or in /nonexistent/go/bin/go"),
        "{}",
        stderr(&o)
    );
}

/// A zip that is not the toolchain (a valid zip, wrong files) fails the checksum database's
/// hash: refused, removed, nothing unpacked.
#[test]
fn a_zip_that_is_not_the_toolchain_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let proxy = t.path().join("proxy");
    let zip = proxy.join(ZIP.strip_prefix("goproxy/").unwrap());
    std::fs::create_dir_all(zip.parent().unwrap()).unwrap();
    let made = Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile\n\
             with zipfile.ZipFile(sys.argv[1], 'w') as z:\n    \
             z.writestr('golang.org/toolchain@v0.0.1-go1.26.8.linux-amd64/bin/go', '#!/bin/sh\\necho go version go1.26.8 linux/amd64\\n')\n",
        ])
        .arg(&zip)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", stderr(&made));
    let cache = t.path().join("cache");
    let o = go_sh(None, &cache, &format!("file://{}", proxy.display()));
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("checksum mismatch")
            && err.contains("the checksum database says h1:ZOmGe1OnfREDMIdb1Qi4G9JSuDPBLGExZMQ4nis1RXM="),
        "{err}"
    );
    assert!(!cache.join("go1.26.8").exists() && !cache.join(ZIP).exists());
}

/// A go 1.26 or newer on PATH is used as it is; an explicit `GO` that is too old is refused,
/// never replaced.
#[test]
fn a_new_enough_go_is_used_and_an_explicit_old_one_refused() {
    let t = tempfile::tempdir().unwrap();
    let new = fake_go(&t.path().join("new"), "go1.27.1");
    let o = go_sh(Some(&new), &t.path().join("cache"), "off");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(PathBuf::from(stdout(&o).trim()), new.join("go"));
    let old = fake_go(&t.path().join("old"), "go1.19.8");
    let o = Command::new(manifest_dir().join("lab/tools/go.sh"))
        .env("GO", old.join("go"))
        .env("GOPROXY", "off")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(&format!("GO={}/go is go1.19.8, older than go1.26", old.display())),
        "{}",
        stderr(&o)
    );
}
