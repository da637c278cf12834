//! One test per row of docs/errors.md: the real binary against a scratch copy of a fixture host
//! (`GPUPASS_FAKE_KERNEL=1`), checking the exit status, that the message names what the row
//! says, that it did not panic (101) or hang, and that the host tree did not change.
//!
//! Each row is `row!(e_bind_07, Case {...})`: the test function is the row's id in lower case.
//! `every_row_has_a_test` parses docs/errors.md and fails when the table and this file disagree;
//! rows that need a real kernel or KVM are listed in [`ELSEWHERE`] with where they are covered.

use crate::util::{
    copy_tree, drivers, host, kvm_available, manifest_dir, need_tool, run_bounded, run_bounded_stdin,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What must be unchanged afterwards.
#[derive(Clone, Copy, PartialEq)]
enum Keep {
    /// The whole tree (but the lock file, which `flock` needs to exist).
    Tree,
    /// Every function's driver (the row's own hook changes the tree).
    Drivers,
    /// The whole tree but the journal: a change that failed after its first write and was
    /// rolled back leaves its `rolled_back` record, and the host as it was.
    Host,
}

type Guard = Option<Box<dyn std::any::Any>>;

struct Case {
    host: &'static str,
    /// `--root`; `{root}` is the scratch copy.
    root: &'static str,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    code: i32,
    needles: &'static [&'static str],
    setup: fn(&Path) -> Guard,
    keep: Keep,
    /// Standard input (`{root}` is the scratch copy); empty: /dev/null.
    stdin: &'static str,
    /// A command the binary runs under (`{root}` is the scratch copy): a shell that sets a limit,
    /// a mount namespace. The binary and its arguments follow it (`exec "$@"`).
    wrap: &'static [&'static str],
    /// What the row needs beyond the fixture: `kvm` (this machine's /dev/kvm, as tests/it/boot.rs;
    /// GPUPASS_SKIP_KVM_TESTS skips visibly, except under CI=true: a failure), or a tool run as root (`need_tool`: SKIPPED
    /// locally without it, a failure under CI=true).
    needs: &'static [&'static str],
}

impl Case {
    const DEFAULT: Case = Case {
        host: "workstation",
        root: "{root}",
        args: &[],
        env: &[],
        code: 1,
        needles: &[],
        setup: none,
        keep: Keep::Tree,
        stdin: "",
        wrap: &[],
        needs: &[],
    };
}

fn none(_: &Path) -> Guard {
    None
}

fn gp(root: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    gp_in(root, args, env, None, &[])
}

fn gp_in(
    root: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: Option<&Path>,
    wrap: &[String],
) -> (Option<i32>, String, String) {
    let bin = env!("CARGO_BIN_EXE_gpupass");
    let mut c = match wrap.split_first() {
        None => Command::new(bin),
        Some((w, rest)) => {
            let mut c = Command::new(w);
            c.args(rest).arg(bin);
            c
        }
    };
    c.arg("--root").arg(root).args(args);
    c.env_remove("GPUPASS_ROOT").env("GPUPASS_FAKE_KERNEL", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    match stdin {
        Some(p) => run_bounded_stdin(c, 60, Some(p)),
        None => run_bounded(c, 60),
    }
}

/// Setup helper: a gpupass command that must succeed.
fn must(root: &Path, args: &[&str], env: &[(&str, &str)]) {
    let (code, out, err) = gp(root, args, env);
    assert_eq!(code, Some(0), "setup {args:?} failed: {out}{err}");
}

/// Every entry under `dir`: kind plus link target or content.
fn m_is_dir(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
}

fn tree(dir: &Path, keep: Keep) -> BTreeMap<String, String> {
    fn walk(base: &Path, dir: &Path, keep: Keep, out: &mut BTreeMap<String, String>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            // The lock (and its directory) exists once any changing command ran; it holds no state.
            let lock = matches!(rel.as_str(), "run" | "run/gpupass" | "run/gpupass/lock");
            if lock || (keep != Keep::Tree && rel.starts_with("run/gpupass")) {
                if m_is_dir(&p) {
                    walk(base, &p, keep, out);
                }
                continue;
            }
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if m.file_type().is_symlink() {
                out.insert(rel, format!("-> {}", std::fs::read_link(&p).unwrap().display()));
            } else if m.is_dir() {
                out.insert(rel, "dir".into());
                walk(base, &p, keep, out);
            } else if m.is_file() {
                out.insert(rel, format!("{:?}", std::fs::read(&p).unwrap_or_default()));
            } else {
                out.insert(rel, "special".into());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, keep, &mut out);
    out
}

/// A row of docs/errors.md: the message column, the exit status column, the test column.
struct DocRow {
    message: String,
    exit: String,
    test: String,
}

/// docs/errors.md's rows by id.
fn doc_rows() -> BTreeMap<String, DocRow> {
    let doc = std::fs::read_to_string(manifest_dir().join("docs/errors.md")).unwrap();
    doc.lines()
        .filter(|l| l.starts_with("| E-"))
        .map(|l| {
            let cols: Vec<&str> = l.split(" | ").collect();
            let id = cols[0].trim_start_matches("| ").to_string();
            let row = DocRow {
                message: cols[2].to_string(),
                exit: cols[cols.len() - 3].trim().to_string(),
                test: cols.last().unwrap().trim_end_matches(" |").trim().to_string(),
            };
            (id, row)
        })
        .collect()
}

fn check(id: &str, c: Case) {
    for need in c.needs {
        let have = match *need {
            "kvm" => kvm_available(),
            tool => need_tool(tool),
        };
        if !have {
            return;
        }
    }
    // The exit status the binary gives must be the one docs/errors.md states for the row.
    let documented = doc_rows()
        .remove(id)
        .unwrap_or_else(|| panic!("{id}: no such row in docs/errors.md"))
        .exit;
    let t = tempfile::tempdir().unwrap();
    let scratch = t.path().join("host");
    copy_tree(&host(c.host), &scratch);
    let _guard = (c.setup)(&scratch);
    let s = scratch.to_str().unwrap();
    let subst = |a: &str| a.replace("{root}", s);
    let root = PathBuf::from(subst(c.root));
    let hotplug = "mkdir -p sys/kernel/iommu_groups/1/devices && \
        ln -s ../../../../devices/pci0000:00/0000:00:01.0/0000:01:00.2 sys/kernel/iommu_groups/1/devices/0000:01:00.2";
    let env: Vec<(&str, String)> = c
        .env
        .iter()
        .map(|(k, v)| {
            (
                *k,
                if *v == "HOTPLUG" {
                    hotplug.to_string()
                } else {
                    subst(v)
                },
            )
        })
        .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let args: Vec<String> = c.args.iter().map(|a| subst(a)).collect();
    let args: Vec<&str> = args.iter().map(|a| a.as_str()).collect();
    let before = tree(&scratch, c.keep);
    let drv_before = drivers(&scratch);
    let stdin = (!c.stdin.is_empty()).then(|| {
        let p = t.path().join("stdin");
        std::fs::write(&p, subst(c.stdin)).unwrap();
        p
    });
    let wrap: Vec<String> = c.wrap.iter().map(|a| subst(a)).collect();
    let (code, out, err) = gp_in(&root, &args, &env, stdin.as_deref(), &wrap);
    assert_ne!(code, Some(101), "{id}: gpupass panicked:\n{err}");
    assert_eq!(
        code.map(|c| c.to_string()),
        Some(documented.clone()),
        "{id}: {args:?} exited {code:?}, docs/errors.md's exit column says {documented}\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert_eq!(
        code,
        Some(c.code),
        "{id}: {args:?} exit status\nstdout:\n{out}\nstderr:\n{err}"
    );
    let text = format!("{out}{err}");
    for n in c.needles {
        let n = subst(n);
        assert!(
            text.contains(&n),
            "{id}: {args:?}: the message lacks {n:?}:\n{text}"
        );
    }
    if c.keep == Keep::Drivers {
        assert_eq!(drivers(&scratch), drv_before, "{id}: a driver changed");
    } else {
        let after = tree(&scratch, c.keep);
        let changed: Vec<_> = before
            .keys()
            .chain(after.keys())
            .filter(|k| before.get(*k) != after.get(*k))
            .collect();
        assert!(changed.is_empty(), "{id}: {args:?} changed the host: {changed:?}");
    }
}

macro_rules! row {
    ($name:ident, $case:expr) => {
        #[test]
        fn $name() {
            check(&stringify!($name).to_uppercase().replace('_', "-"), $case)
        }
    };
}

// ---- setups ----

fn bad_json(r: &Path) -> Guard {
    std::fs::write(r.join("bad.json"), "{").unwrap();
    None
}

fn new_schema(r: &Path) -> Guard {
    let j = std::fs::read_to_string(manifest_dir().join("tests/golden/workstation/list-all.json")).unwrap();
    let j = j.replacen("\"schema_version\": 1", "\"schema_version\": 999", 1);
    std::fs::write(r.join("new.json"), j).unwrap();
    None
}

fn hold_lock(r: &Path) -> Guard {
    let d = r.join("run/gpupass");
    std::fs::create_dir_all(&d).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(d.join("lock"))
        .unwrap();
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).unwrap();
    Some(Box::new(f))
}

fn crashed_bind(r: &Path) -> Guard {
    let (code, _, _) = gp(r, &["bind", "01:00.0"], &[("GPUPASS_CRASH_AFTER_WRITE", "2")]);
    assert_eq!(code, None, "the injected crash kills gpupass");
    None
}

/// `persist 01:00.0` (two driverctl files) dies after its first file write: the plan stays
/// open in the journal.
fn crashed_persist(r: &Path) -> Guard {
    let (code, _, _) = gp(r, &["persist", "01:00.0"], &[("GPUPASS_CRASH_AFTER_WRITE", "1")]);
    assert_eq!(code, None, "the injected crash kills gpupass");
    None
}

/// [`crashed_persist`], and the second file's path taken by a directory, so finishing the plan
/// cannot write it.
fn crashed_persist_blocked(r: &Path) -> Guard {
    crashed_persist(r);
    std::fs::create_dir_all(r.join("etc/driverctl.d/pci-0000:01:00.1/x")).unwrap();
    None
}

/// `mdev create` of one mtty instance dies right after the create write.
fn crashed_mdev_create(r: &Path) -> Guard {
    let (code, _, _) = gp(
        r,
        &["mdev", "create", "-p", "mtty", "-t", "mtty-2", "-u", CRASHED_MDEV],
        &[("GPUPASS_CRASH_AFTER_WRITE", "1")],
    );
    assert_eq!(code, None, "the injected crash kills gpupass");
    None
}

const CRASHED_MDEV: &str = "2f0e0d0c-0b0a-4908-8706-0504030201bb";

fn refuse_bind(r: &Path) -> Guard {
    std::fs::write(
        r.join("sys/bus/pci/devices/0000:01:00.0/.fake_refuse_bind"),
        "vfio-pci\n",
    )
    .unwrap();
    None
}

fn bound_and_open(r: &Path) -> Guard {
    must(r, &["bind", "01:00.0"], &[]);
    let p = r.join("proc/4242");
    std::fs::create_dir_all(p.join("fd")).unwrap();
    std::fs::write(p.join("comm"), "qemu-system-x86\n").unwrap();
    std::os::unix::fs::symlink("/dev/vfio/1", p.join("fd/3")).unwrap();
    None
}

fn run_is_file(r: &Path) -> Guard {
    std::fs::create_dir_all(r.join("run")).unwrap();
    std::fs::write(r.join("run/gpupass"), "").unwrap();
    None
}

fn second_definition(r: &Path) -> Guard {
    let u = "5e1a3b9c-0d2f-4e6a-8b7c-9d0e1f2a3b4c";
    let d = r.join("etc/mdevctl.d/mbochs");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(r.join("etc/mdevctl.d/mdpy").join(u), d.join(u)).unwrap();
    None
}

fn orphan_definition(r: &Path) -> Guard {
    let d = r.join("etc/mdevctl.d/0000:99:00.0");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("0f0e0d0c-0b0a-4908-8706-050403020100"),
        "{\"mdev_type\":\"x\",\"start\":\"manual\",\"attrs\":[]}\n",
    )
    .unwrap();
    None
}

fn hgx_on_vfio(r: &Path) -> Guard {
    must(
        r,
        &[
            "bind", "--force", "03:00.0", "04:00.0", "05:00.0", "06:00.0", "07:00.0", "83:00.0", "84:00.0",
            "85:00.0", "86:00.0",
        ],
        &[],
    );
    None
}

fn qemu_holds_mdev(r: &Path) -> Guard {
    let p = r.join("proc/777");
    std::fs::create_dir_all(p.join("fd")).unwrap();
    std::fs::write(p.join("comm"), "qemu-system-x86\n").unwrap();
    std::os::unix::fs::symlink("/dev/vfio/100", p.join("fd/31")).unwrap();
    None
}

fn no_kvm(r: &Path) -> Guard {
    let _ = std::fs::remove_file(r.join("dev/kvm"));
    None
}

fn empty_firmware(r: &Path) -> Guard {
    std::fs::write(r.join("empty.bin"), "").unwrap();
    None
}

fn gpu_group_on_vfio(r: &Path) -> Guard {
    must(r, &["bind", "01:00.0"], &[]);
    None
}

/// The workstation's GPU group on vfio-pci, on a host CPU with 36 physical address bits: its
/// 128G window needs 38.
fn gpu_group_on_vfio_36_bits(r: &Path) -> Guard {
    must(r, &["bind", "01:00.0"], &[]);
    std::fs::create_dir_all(r.join("proc")).unwrap();
    std::fs::write(
        r.join("proc/cpuinfo"),
        "processor\t: 0\naddress sizes\t: 36 bits physical, 48 bits virtual\n",
    )
    .unwrap();
    None
}

/// An Intel VT-d unit with a 39-bit MGAW (client platforms) beside the fixture's AMD-Vi units.
fn iommu_39_bits(r: &Path) -> Guard {
    let unit = r.join("sys/devices/virtual/iommu/dmar9/intel-iommu");
    std::fs::create_dir_all(&unit).unwrap();
    std::fs::write(unit.join("cap"), "d2008c20260466\n").unwrap();
    std::os::unix::fs::symlink(
        "../../devices/virtual/iommu/dmar9",
        r.join("sys/class/iommu/dmar9"),
    )
    .unwrap();
    None
}

/// E-BIND-19: the fake kernel's probe hands 17:00.0 to vfio-pci (as vfio-pci.ids= would).
fn vfio_ids_claim_17(r: &Path) -> Guard {
    std::fs::write(
        r.join("sys/bus/pci/devices/0000:17:00.0/.fake_native_driver"),
        "vfio-pci",
    )
    .unwrap();
    None
}

/// E-BOOT-10's wrapper (`$0`: the scratch copy; then the binary and its arguments): the binary
/// copied beside the scratch copy, into directories the user nobody can enter, and run as nobody.
const AS_NOBODY: &str = r#"set -e; t=$(dirname "$0"); b=$1; shift
mkdir "$t/bin"; cp "$b" "$t/bin/gpupass"; chmod 755 "$t" "$t/bin"
exec setpriv --reuid=65534 --regid=65534 --clear-groups "$t/bin/gpupass" "$@""#;

/// Where [`VFIO_FIXTURE_NS`] keeps the real /dev while the fixture's covers it.
fn live_dev_dir(r: &Path) -> Guard {
    std::fs::create_dir(r.join("livedev")).unwrap();
    None
}

/// The mount namespace of E-BOOT-13 (`$0`: the scratch copy; then the binary and its
/// arguments): the scratch copy's sys over /sys, a tmpfs /dev with the fixture's nodes (regular
/// files) and the real /dev/kvm and /dev/null bound in. `unshare --propagation private`: none of
/// it reaches the host's mounts, and it all ends with the process.
const VFIO_FIXTURE_NS: &str = r#"set -e; R=$0
mount --bind /dev "$R/livedev"
mount --bind "$R/sys" /sys
mount -t tmpfs tmpfs /dev
cp -a "$R/dev/." /dev/
touch /dev/kvm /dev/null
mount --bind "$R/livedev/kvm" /dev/kvm
mount --bind "$R/livedev/null" /dev/null
exec "$@""#;

fn gpu_only_on_vfio(r: &Path) -> Guard {
    must(r, &["bind", "--only", "01:00.0"], &[]);
    None
}

fn var_run_cdi_is_file(r: &Path) -> Guard {
    std::fs::create_dir_all(r.join("var/run")).unwrap();
    std::fs::write(r.join("var/run/cdi"), "").unwrap();
    None
}

fn nvidia_without_minor(r: &Path) -> Guard {
    let p = r.join("proc/driver/nvidia/gpus/0000:01:00.0/information");
    let t = std::fs::read_to_string(&p).unwrap();
    let t: String = t
        .lines()
        .filter(|l| !l.starts_with("Device Minor"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&p, t).unwrap();
    None
}

fn driverctl(r: &Path, addr: &str) {
    let d = r.join("etc/driverctl.d");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(format!("pci-{addr}")), "vfio-pci\n").unwrap();
}

fn persisted_bridge(r: &Path) -> Guard {
    driverctl(r, "0000:00:01.0");
    None
}

fn persisted_gpu(r: &Path) -> Guard {
    driverctl(r, "0000:01:00.0");
    None
}

/// An OCI bundle at `{root}/bundle` with this config.json (`None`: none) and a rootfs.
fn oci_bundle(r: &Path, config: Option<&str>) {
    let b = r.join("bundle");
    std::fs::create_dir_all(b.join("rootfs")).unwrap();
    if let Some(c) = config {
        std::fs::write(b.join("config.json"), c).unwrap();
    }
}

const OCI_CONFIG: &str = r#"{"ociVersion": "1.0.2", "root": {"path": "rootfs"}}"#;

fn bundle(r: &Path) -> Guard {
    oci_bundle(r, Some(OCI_CONFIG));
    None
}

/// A bundle on a host whose /dev/iommu is gone (iommufd not loaded).
fn bundle_without_dev_iommu(r: &Path) -> Guard {
    std::fs::remove_file(r.join("dev/iommu")).unwrap();
    oci_bundle(r, Some(OCI_CONFIG));
    None
}

fn bundle_without_config(r: &Path) -> Guard {
    oci_bundle(r, None);
    None
}

fn bundle_config_not_json(r: &Path) -> Guard {
    oci_bundle(r, Some("ociVersion: 1.0.2\n"));
    None
}

fn bundle_without_root_path(r: &Path) -> Guard {
    oci_bundle(r, Some(r#"{"ociVersion": "1.0.2"}"#));
    None
}

fn bundle_rootfs_missing(r: &Path) -> Guard {
    oci_bundle(r, Some(r#"{"ociVersion": "1.0.2", "root": {"path": "nothere"}}"#));
    None
}

fn bundle_gpu_only_on_vfio(r: &Path) -> Guard {
    gpu_only_on_vfio(r);
    bundle(r)
}

/// vfio-numa without group 40's legacy node and without /dev/iommu.
fn bundle_no_group_node(r: &Path) -> Guard {
    std::fs::remove_file(r.join("dev/vfio/40")).unwrap();
    std::fs::remove_file(r.join("dev/iommu")).unwrap();
    bundle(r)
}

/// vfio-numa whose group 40 nodes are character devices (links to /dev/null), without iommufd.
fn bundle_char_nodes(r: &Path) -> Guard {
    for n in ["vfio", "40"] {
        let p = r.join("dev/vfio").join(n);
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/dev/null", &p).unwrap();
    }
    std::fs::remove_file(r.join("dev/iommu")).unwrap();
    bundle(r)
}

/// Container pid 4242 in this cgroup, with (or without) a mount namespace file that is no
/// namespace.
fn container_proc(r: &Path, cgroup: &str, ns: bool) {
    let p = r.join("proc/4242");
    std::fs::create_dir_all(p.join("ns")).unwrap();
    std::fs::write(p.join("cgroup"), cgroup).unwrap();
    if ns {
        std::fs::write(p.join("ns/mnt"), "").unwrap();
    }
}

fn container_without_ns(r: &Path) -> Guard {
    container_proc(r, "0::/ctr\n", false);
    bundle_char_nodes(r)
}

/// A container on the unified hierarchy (cgroup v2 only: `/sys/fs/cgroup` holds
/// `cgroup.controllers`) whose cgroup directory `ctr` is missing.
fn container_v2_no_cgroup(r: &Path) -> Guard {
    container_proc(r, "0::/ctr\n", true);
    std::fs::create_dir_all(r.join("sys/fs/cgroup")).unwrap();
    std::fs::write(r.join("sys/fs/cgroup/cgroup.controllers"), "").unwrap();
    bundle_char_nodes(r)
}

/// As `container_v2_no_cgroup`, with `ctr` a plain directory (no cgroup): the kernel refuses
/// the BPF_PROG_QUERY, before anything is loaded or attached.
fn container_v2_not_a_cgroup(r: &Path) -> Guard {
    let g = container_v2_no_cgroup(r);
    std::fs::create_dir_all(r.join("sys/fs/cgroup/ctr")).unwrap();
    g
}

fn container_v1_without_controller(r: &Path) -> Guard {
    container_proc(r, "4:devices:/ctr\n0::/ctr\n", true);
    bundle_char_nodes(r)
}

/// A container (pid 4242, cgroup `ctr`) on cgroup v1 whose devices controller has
/// devices.allow and devices.deny only when asked, and `list` as its devices.list (the fake
/// kernel shows written rules there). Its mount namespace file is no namespace, so entering it
/// fails after the cgroup step.
fn container_v1(r: &Path, allow: bool, deny: bool, list: &str) -> Guard {
    container_proc(r, "4:devices:/ctr\n0::/ctr\n", true);
    let cg = r.join("sys/fs/cgroup/devices/ctr");
    std::fs::create_dir_all(&cg).unwrap();
    if allow {
        std::fs::write(cg.join("devices.allow"), "").unwrap();
    }
    if deny {
        std::fs::write(cg.join("devices.deny"), "").unwrap();
    }
    std::fs::write(cg.join("devices.list"), list).unwrap();
    bundle_char_nodes(r)
}

/// Runc's kind of cgroup (deny by default, a pty rule): the rules are written, then taken back.
fn container_v1_ns_fails(r: &Path) -> Guard {
    container_v1(r, true, true, "c 136:* rwm\n")
}

/// An allow-all cgroup (`a *:* rwm`: no runtime restricts it, or the container shares the
/// host's cgroup): the hook writes no rule, so there is none to take back and no device is
/// denied afterwards. It has no devices.allow or devices.deny here: any write would fail and
/// show.
fn container_v1_allow_all_ns_fails(r: &Path) -> Guard {
    container_v1(r, false, false, "a *:* rwm\n")
}

/// As `container_v1_ns_fails`, without devices.deny: the rules cannot be taken back.
fn container_v1_ns_fails_no_deny(r: &Path) -> Guard {
    container_v1(r, true, false, "c 136:* rwm\n")
}

/// Cgroup v1 with the devices controller and two distinct rules to write (group 40's node is
/// /dev/zero), so the second devices.allow write can fail after the first.
fn container_v1_two_rules(r: &Path) -> Guard {
    let g = container_v1(r, true, true, "c 136:* rwm\n");
    let p = r.join("dev/vfio/40");
    std::fs::remove_file(&p).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
    g
}

/// The OCI state of container pid 4242 asking for IOMMU group 40 (`{root}`: the scratch copy).
const STATE_GROUP_40: &str = r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":4242,"bundle":"{root}/bundle","annotations":{"gpupass.dev/devices":"40"}}"#;

/// Rows covered outside this file (real kernel, libvirt, runc, gRPC), as docs/errors.md says:
/// (id, the row's test column, a fragment of the row's message). The fragment must be in the
/// row's message in docs/errors.md and in what covers it: the test functions the note names, the
/// condition of the lab step it names (which also checks the row's exit status), the file's
/// `#[cfg(test)]` part for a unit test; "" for an `uncovered:` row.
const ELSEWHERE: &[(&str, &str, &str)] = &[
    ("E-EVENTS-03", "uncovered: needs a kernel or sandbox that refuses AF_NETLINK sockets; the lab scenario `events` (lab/scenarios) exercises the working path", ""),
    ("E-OUT-14", "integration: tests/it/vm_attach.rs (built with --features libvirt, libvirt's test:///default driver)", "gpupass: libvirt: "),
    ("E-BOOT-11", "lab: lab/scenarios/boot.sh (timeout step); tests/it/boot.rs when /dev/kvm is usable", "did not finish within"),
    ("E-BOOT-12", "lab: lab/scenarios/boot.sh (triple-fault step)", "triple-faulted (KVM_EXIT_SHUTDOWN)"),
    ("E-BOOT-15", "integration: tests/it/boot.rs `check_fails_when_the_interrupt_is_not_routed` (and the lab's selftest scenario, its failing cases)", "gpupass: boot --check: "),
    ("E-BOOT-16", "lab: lab/scenarios/selftest.sh (nic-strict step); src/vmm/verdict.rs", "the device has them and gpupass could not test them"),
    ("E-CDI-09", "uncovered: needs a kernel or sandbox that refuses AF_NETLINK sockets (as E-EVENTS-03); tests/it/lab.rs runs the cdiwatch scenario", ""),
    ("E-HOOK-20", "integration: tests/it/oci_hook.rs `symlinks_in_the_rootfs_are_not_followed` (runc, root: a real container mount namespace)", "is a symlink or not a directory"),
    ("E-HOOK-21", "uncovered: needs a container mount namespace whose rootfs refuses mknod (read-only, or a user namespace); tests/it/oci_hook.rs covers the working path under runc", ""),
    ("E-DP-05", "integration: tests/it/deviceplugin.rs `plugin_registers_lists_allocates_and_follows_health_and_kubelet_restarts` (gRPC InvalidArgument)", "is not a PCI address (expected 0000:01:00.0)"),
    ("E-DP-06", "integration: tests/it/deviceplugin.rs `plugin_registers_lists_allocates_and_follows_health_and_kubelet_restarts` and `plugin_serves_mdev_types` (gRPC NotFound)", "is not a device of resource"),
    ("E-LAUNCH-03", "lab: lab/scenarios/nested.sh (launch-exec-error step)", "cannot run "),
    ("E-DP-07", "integration: tests/it/deviceplugin.rs `plugin_registers_lists_allocates_and_follows_health_and_kubelet_restarts` (gRPC FailedPrecondition)", "cannot be allocated: "),
    ("E-DRA-01", "integration: tests/it/dra.rs `the_plugin_needs_the_live_host_and_a_valid_driver_name`", "invalid DRA driver name"),
    ("E-DRA-02", "integration: tests/it/dra.rs `the_plugin_needs_the_live_host_and_a_valid_driver_name`", "cannot tell this node's name"),
    ("E-DRA-03", "unit: src/containers/dra/tests.rs `registers_prepares_serializes_watches_health_and_unprepares_over_unix_sockets`", "is prepared for claim"),
    ("E-DRA-04", "unit: src/containers/dra/tests.rs `registers_prepares_serializes_watches_health_and_unprepares_over_unix_sockets`", "is not a device this node offers"),
    ("E-DRA-05", "unit: src/containers/dra/tests.rs `registers_prepares_serializes_watches_health_and_unprepares_over_unix_sockets`", "the API server has UID"),
    ("E-DRA-06", "unit: src/containers/dra/claim.rs `the_opaque_config_sets_the_policy_and_unknown_fields_or_values_are_errors`", "opaque configuration for "),
    ("E-DRA-07", "unit: src/containers/dra/claim.rs `another_node_or_pool_or_driver_is_refused`", "not to this node"),
    ("E-DRA-08", "unit: src/containers/dra/claim.rs `one_claim_gets_one_backend_policy`", "ask for different backend policies"),
    ("E-DRA-09", "unit: src/containers/dra/checkpoint.rs `round_trips_root_only`", "is not a checkpoint gpupass can read"),
    ("E-DRA-10", "unit: src/containers/dra/claim.rs `uids_and_request_names_that_could_leave_a_directory_are_refused`", "is not a Kubernetes name"),
    ("E-DRA-11", "integration: tests/it/dra.rs `the_plugin_needs_the_live_host_and_a_valid_driver_name`", "cannot read the boot id"),
    ("E-DRA-12", "unit: src/containers/dra/prepare.rs `a_device_in_use_or_a_held_lock_fails_fast_naming_why`", "did not finish within"),
    ("E-DRA-13", "unit: src/containers/dra/prepare.rs `a_device_in_use_or_a_held_lock_fails_fast_naming_why`", "is open by pid"),
];

/// The ids of this file's `row!()` tests, in file order.
fn row_ids() -> Vec<String> {
    include_str!("errors.rs")
        .split("\nrow!(")
        .skip(1)
        .map(|l| {
            l.trim_start()
                .split(',')
                .next()
                .unwrap()
                .to_uppercase()
                .replace('_', "-")
        })
        .collect()
}

#[test]
fn every_row_has_a_test() {
    let rows = doc_rows();
    assert!(rows.len() >= 40, "docs/errors.md has too few rows");
    let mut here = Vec::new();
    let mut elsewhere = Vec::new();
    for (id, row) in &rows {
        assert!(
            matches!(row.exit.as_str(), "1" | "2"),
            "{id}: exit status column {:?}",
            row.exit
        );
        if row.test == "errors.rs" {
            here.push(id.clone());
        } else {
            elsewhere.push(id.clone());
        }
    }
    let mut tests = row_ids();
    tests.sort();
    assert_eq!(
        here, tests,
        "docs/errors.md rows marked errors.rs vs row!() tests"
    );
    let mut other: Vec<String> = ELSEWHERE.iter().map(|(i, _, _)| i.to_string()).collect();
    other.sort();
    assert_eq!(elsewhere, other, "docs/errors.md lab/unit rows vs ELSEWHERE");
    for (id, note, _) in ELSEWHERE {
        assert_eq!(
            &rows[*id].test, note,
            "{id}: ELSEWHERE's note differs from docs/errors.md"
        );
    }
}

/// Each row's exit status in docs/errors.md is the one its `row!()` case asserts (`code:`, 1
/// when the case leaves it to `Case::DEFAULT`). `check` also compares the status the binary
/// really gave with the row's; this catches a case whose code and row drift together.
#[test]
fn every_row_states_the_exit_status_its_test_asserts() {
    let rows = doc_rows();
    let src = include_str!("errors.rs");
    let mut compared = 0;
    for (block, id) in src.split("\nrow!(").skip(1).zip(row_ids()) {
        let case = block.split("\n);").next().unwrap();
        let code = case
            .lines()
            .find_map(|l| l.trim().strip_prefix("code: "))
            .map(|c| c.trim_end_matches(',').to_string())
            .unwrap_or_else(|| "1".to_string());
        assert_eq!(
            rows.get(&id).map(|r| &r.exit),
            Some(&code),
            "{id}: docs/errors.md's exit status vs its test's code"
        );
        compared += 1;
    }
    assert!(compared > 100, "compared only {compared} rows");
}

/// The body of `fn name(` in a Rust source: from its line to the first `}` at that indent.
fn fn_body<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = text.find(&format!("fn {name}("))?;
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let indent = &text[line_start..start];
    let indent = &indent[..indent.len() - indent.trim_start().len()];
    let end = text[start..]
        .find(&format!("\n{indent}}}\n"))
        .map_or(text.len(), |e| start + e);
    Some(&text[start..end])
}

/// Every "covered elsewhere" note names things that exist and hold the row: each file it names
/// exists; each test function it names in backticks after a `tests/it/X.rs` is a function of
/// that file whose body holds the row's message fragment; each lab step it names is declared by
/// that scenario (`# lab-steps`) and decided by a condition that checks the row's exit status
/// (`$rc = N`) and its message fragment; a `src/` unit file holds a `#[test]` and the fragment in
/// its `#[cfg(test)]` part; any other named file holds the fragment.
#[test]
fn elsewhere_notes_name_tests_that_exist() {
    let root = manifest_dir();
    let rows = doc_rows();
    for (id, note, fragment) in ELSEWHERE {
        let row = &rows[*id];
        assert_eq!(
            note.starts_with("uncovered:"),
            fragment.is_empty(),
            "{id}: a covered row needs a fragment"
        );
        assert!(
            row.message.contains(fragment),
            "{id}: {fragment:?} is not in the row's message {}",
            row.message
        );
        let words: Vec<&str> = note
            .split(|c: char| c.is_whitespace() || c == ';' || c == '(' || c == ')' || c == ',')
            .filter(|w| !w.is_empty())
            .collect();
        let files: Vec<&str> = words
            .iter()
            .map(|w| w.trim_end_matches(':'))
            .filter(|w| w.ends_with(".rs") || w.ends_with(".sh"))
            .collect();
        assert!(
            !files.is_empty() || note.starts_with("uncovered:"),
            "{id}: the note names no file: {note}"
        );
        for f in &files {
            assert!(
                f.starts_with("lab/scenarios/") || f.starts_with("tests/it/") || f.starts_with("src/"),
                "{id}: {f}: name files from the repository root"
            );
            let text =
                std::fs::read_to_string(root.join(f)).unwrap_or_else(|_| panic!("{id}: {f} does not exist"));
            if fragment.is_empty() {
                continue;
            }
            let fns: Vec<&str> = note
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|name| {
                    f.ends_with(".rs")
                        && (note.contains(&format!("{f} `{name}`"))
                            || note.contains(&format!("and `{name}`")))
                })
                .collect();
            if f.starts_with("tests/it/") && !fns.is_empty() {
                for name in fns {
                    let body =
                        fn_body(&text, name).unwrap_or_else(|| panic!("{id}: {f} has no test fn {name}"));
                    assert!(
                        body.contains(fragment),
                        "{id}: {f} `{name}` does not check {fragment:?}"
                    );
                }
            } else if f.starts_with("src/") {
                // A module's sibling `tests.rs` is test code from its first line; a module
                // whose long tests are a file of their own (`<name>/tests.rs` beside
                // `<name>.rs`, docs/ARCHITECTURE.md) has them there.
                let own = crate::util::manifest_dir()
                    .join(f.trim_end_matches(".rs"))
                    .join("tests.rs");
                let moved = if f.ends_with("/tests.rs") || f.ends_with("/mod.rs") {
                    None
                } else {
                    std::fs::read_to_string(&own).ok()
                };
                let tests = if f.ends_with("/tests.rs") {
                    text.as_str()
                } else if let Some(m) = moved.as_deref() {
                    m
                } else {
                    text.split_once("#[cfg(test)]").map(|(_, t)| t).unwrap_or("")
                };
                assert!(tests.contains("#[test]"), "{id}: {f} has no #[test]");
                assert!(
                    tests.contains(fragment),
                    "{id}: {f}'s tests do not check {fragment:?}"
                );
            } else if f.ends_with(".sh") {
                let steps: Vec<&str> = text
                    .lines()
                    .filter_map(|l| {
                        l.strip_prefix("# lab-steps")
                            .and_then(|r| r.split_once(':'))
                            .map(|(_, s)| s)
                    })
                    .flat_map(|s| s.split_whitespace())
                    .collect();
                // "step NAME" or "NAME step".
                let named: Vec<&str> = words
                    .windows(2)
                    .filter_map(|w| match (w[0], w[1]) {
                        ("step", n) if !n.contains('/') => Some(n),
                        (n, "step") if !n.contains('/') => Some(n),
                        _ => None,
                    })
                    .collect();
                assert!(!named.is_empty(), "{id}: the note names no step of {f}");
                for n in named {
                    assert!(steps.contains(&n), "{id}: {f} declares no step {n}");
                    let lines: Vec<&str> = text.lines().collect();
                    let pass = lines
                        .iter()
                        .position(|l| l.trim_start().starts_with(&format!("lab_pass {n} ")))
                        .unwrap_or_else(|| panic!("{id}: {f} never passes step {n} (lab_pass {n})"));
                    let cond = lines[..pass]
                        .iter()
                        .rev()
                        .find(|l| l.trim_start().starts_with("if ") || l.trim_start().starts_with("elif "))
                        .unwrap_or_else(|| panic!("{id}: {f}: step {n} passes unconditionally"));
                    assert!(
                        cond.contains(&format!("$rc = {}", row.exit)),
                        "{id}: {f}: step {n} does not check exit status {} ({cond})",
                        row.exit
                    );
                    assert!(
                        cond.contains(fragment),
                        "{id}: {f}: step {n} does not check {fragment:?} ({cond})"
                    );
                }
            } else {
                assert!(text.contains(fragment), "{id}: {f} does not check {fragment:?}");
            }
        }
    }
}

// ---- the rows ----

row!(
    e_usage_01,
    Case {
        host: "workstation",
        args: &["frobnicate"],
        code: 2,
        needles: &["unrecognized subcommand 'frobnicate'", "Usage:"],
        ..Case::DEFAULT
    }
);
row!(
    e_usage_02,
    Case {
        host: "workstation",
        args: &["list", "--bogus"],
        code: 2,
        needles: &["unexpected argument '--bogus'"],
        ..Case::DEFAULT
    }
);
row!(
    e_usage_03,
    Case {
        host: "workstation",
        args: &["show", "zz"],
        code: 2,
        needles: &["invalid PCI address \"zz\"", "0000:01:00.0"],
        ..Case::DEFAULT
    }
);
row!(
    e_usage_04,
    Case {
        host: "workstation",
        args: &["bind"],
        code: 2,
        needles: &["required arguments were not provided", "<ADDRESSES>"],
        ..Case::DEFAULT
    }
);
row!(
    e_usage_05,
    Case {
        host: "workstation",
        args: &["bind", "01:00.0", "--driver", "../../x"],
        code: 2,
        needles: &["invalid driver name \"../../x\""],
        ..Case::DEFAULT
    }
);
row!(
    e_usage_06,
    Case {
        host: "workstation",
        args: &["boot", "--mdev", "zz"],
        code: 2,
        needles: &["invalid mdev UUID \"zz\"", "8-4-4-4-12"],
        ..Case::DEFAULT
    }
);
row!(
    e_usage_07,
    Case {
        host: "workstation",
        args: &["boot", "--emulated", "--memory", "5T"],
        code: 2,
        needles: &["invalid memory size \"5T\"", "K, M or G"],
        ..Case::DEFAULT
    }
);
row!(
    e_usage_08,
    Case {
        host: "workstation",
        args: &["boot"],
        code: 2,
        needles: &["--device <ADDRESS>|--mdev <UUID>|--emulated"],
        ..Case::DEFAULT
    }
);
row!(
    e_usage_09,
    Case {
        host: "workstation",
        args: &["boot", "--emulated", "--timeout", "0"],
        code: 2,
        needles: &["invalid timeout \"0\""],
        ..Case::DEFAULT
    }
);
row!(
    e_events_01,
    Case {
        host: "workstation",
        args: &["events", "--timeout", "inf"],
        code: 2,
        needles: &["invalid timeout \"inf\"", "31536000"],
        ..Case::DEFAULT
    }
);
row!(
    e_events_02,
    Case {
        host: "workstation",
        args: &["events", "--count", "x"],
        code: 2,
        needles: &["invalid value 'x' for '--count <COUNT>'"],
        ..Case::DEFAULT
    }
);
row!(
    e_inv_01,
    Case {
        host: "workstation",
        args: &["bind", "01:00.0"],
        code: 1,
        needles: &[
            "cannot list PCI devices at {root}/missing/sys/bus/pci/devices",
            "--root"
        ],
        root: "{root}/missing",
        ..Case::DEFAULT
    }
);
row!(
    e_inv_02,
    Case {
        host: "workstation",
        args: &["show", "42:00.0"],
        code: 1,
        needles: &["no PCI device 0000:42:00.0", "gpupass list --all"],
        ..Case::DEFAULT
    }
);
row!(
    e_inv_03,
    Case {
        host: "workstation",
        args: &["--from-json", "{root}/none.json", "list"],
        code: 1,
        needles: &["cannot read saved inventory {root}/none.json", "No such file"],
        ..Case::DEFAULT
    }
);
row!(
    e_inv_04,
    Case {
        host: "workstation",
        args: &["--from-json", "{root}/bad.json", "list"],
        code: 1,
        needles: &[
            "cannot read saved inventory {root}/bad.json",
            "gpupass list --all --json"
        ],
        setup: bad_json,
        ..Case::DEFAULT
    }
);
row!(
    e_inv_05,
    Case {
        host: "workstation",
        args: &["--from-json", "{root}/new.json", "groups"],
        code: 1,
        needles: &["schema_version 999 is newer"],
        setup: new_schema,
        ..Case::DEFAULT
    }
);
row!(
    e_inv_06,
    Case {
        host: "workstation",
        args: &["--from-json", "{root}/none.json", "check"],
        code: 2,
        needles: &["`gpupass check` works on the live host; it cannot run from --from-json"],
        ..Case::DEFAULT
    }
);
row!(
    e_inv_07,
    Case {
        host: "nvidia-minors",
        args: &["check"],
        code: 1,
        needles: &["FAIL", "fix:"],
        ..Case::DEFAULT
    }
);
row!(
    e_bind_01,
    Case {
        host: "workstation",
        args: &["--from-json", "{root}/none.json", "unbind", "01:00.0"],
        code: 2,
        needles: &["`gpupass unbind` works on the live host; it cannot run from --from-json"],
        ..Case::DEFAULT
    }
);
row!(
    e_bind_02,
    Case {
        host: "workstation",
        args: &["bind", "42:00.0"],
        code: 1,
        needles: &[
            "refusing to bind",
            "0000:42:00.0: no such PCI device",
            "fix: `gpupass list --all`"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_bind_03,
    Case {
        host: "workstation",
        args: &["bind", "--force", "00:01.0"],
        code: 1,
        needles: &["is a PCI bridge", "device behind it"],
        ..Case::DEFAULT
    }
);
row!(
    e_bind_04,
    Case {
        host: "legacy-bridge",
        args: &["bind", "05:00.0"],
        code: 1,
        needles: &["also holds 0000:05:01.0", "--only", "ACS"],
        ..Case::DEFAULT
    }
);
row!(
    e_bind_05,
    Case {
        host: "workstation",
        args: &["bind", "00:02.0"],
        code: 1,
        needles: &["boot VGA", "framebuffer console", "--force"],
        ..Case::DEFAULT
    }
);
row!(
    e_bind_06,
    Case {
        host: "workstation",
        args: &["bind", "02:00.0"],
        code: 1,
        needles: &["mounted filesystem / (ext4 on /dev/nvme0n1p2)", "unmount"],
        ..Case::DEFAULT
    }
);
/// A CUDA process holding the GPU's own NVIDIA node (hgx-8gpu: 03:00.0 is minor 0).
fn cuda_process_on_nvidia0(r: &Path) -> Guard {
    let p = r.join("proc/4321");
    std::fs::create_dir_all(p.join("fd")).unwrap();
    std::fs::write(p.join("comm"), "python3\n").unwrap();
    std::os::unix::fs::symlink("/dev/nvidia0", p.join("fd/5")).unwrap();
    std::os::unix::fs::symlink("/dev/nvidiactl", p.join("fd/6")).unwrap();
    None
}

row!(
    e_bind_20,
    Case {
        host: "hgx-8gpu",
        args: &["bind", "03:00.0"],
        needles: &[
            "/dev/nvidia0 is open by pid 4321 (python3): it is using this GPU through NVIDIA's driver",
            "fix: stop python3 (pid 4321) first (`nvidia-smi` lists the GPU's processes)",
        ],
        setup: cuda_process_on_nvidia0,
        ..Case::DEFAULT
    }
);

row!(
    e_bind_07,
    Case {
        host: "workstation",
        args: &["bind", "03:00.0"],
        code: 1,
        needles: &["enp3s0 is up", "ip link set enp3s0 down"],
        ..Case::DEFAULT
    }
);
row!(
    e_bind_08,
    Case {
        host: "nvidia-minors",
        args: &["bind", "07:00.0"],
        code: 1,
        needles: &["has no IOMMU group", "intel_iommu=on"],
        ..Case::DEFAULT
    }
);
row!(
    e_bind_09,
    Case {
        host: "workstation",
        args: &["bind", "01:00.0", "--driver", "nvidia"],
        code: 1,
        needles: &["--driver nvidia is not a VFIO driver or pci-stub"],
        ..Case::DEFAULT
    }
);
row!(
    e_bind_10,
    Case {
        host: "workstation",
        args: &["bind", "01:00.0"],
        code: 1,
        needles: &["another gpupass", "did not finish within", "try again"],
        setup: hold_lock,
        env: &[("GPUPASS_LOCK_TIMEOUT", "0.2")],
        ..Case::DEFAULT
    }
);
row!(
    e_bind_11,
    Case {
        host: "workstation",
        args: &["bind", "01:00.0"],
        code: 1,
        needles: &["has an unfinished gpupass plan", "gpupass recover"],
        setup: crashed_bind,
        ..Case::DEFAULT
    }
);
row!(
    e_change_01,
    Case {
        host: "workstation",
        args: &["persist", "01:00.0"],
        code: 1,
        needles: &[
            "an unfinished gpupass persist of 0000:01:00.0, 0000:01:00.1 (txn ",
            "stopped at write 1 of 2",
            "touches the same file /etc/driverctl.d/pci-0000:01:00.1; run `gpupass recover`",
        ],
        setup: crashed_persist,
        ..Case::DEFAULT
    }
);
row!(
    e_change_02,
    Case {
        host: "workstation",
        args: &["recover", "--continue"],
        code: 1,
        needles: &[
            "recover of txn ",
            "write file /etc/driverctl.d/pci-0000:01:00.1",
            "the plan stays open in the journal; fix the cause and run `gpupass recover` again",
        ],
        setup: crashed_persist_blocked,
        keep: Keep::Host,
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_21,
    Case {
        host: "mdev-lab",
        args: &["mdev", "remove", CRASHED_MDEV],
        code: 1,
        needles: &[
            "an unfinished gpupass mdev create of 2f0e0d0c-0b0a-4908-8706-0504030201bb (mtty-2 on mtty)",
            "stopped at write 1 of 1",
            "touches the same instance; run `gpupass recover`",
        ],
        setup: crashed_mdev_create,
        ..Case::DEFAULT
    }
);
row!(
    e_bind_12,
    Case {
        host: "workstation",
        args: &["bind", "01:00.0"],
        code: 1,
        needles: &["failed", "rolled back, nothing changed"],
        env: &[("GPUPASS_FAIL_WRITE", "2")],
        keep: Keep::Drivers,
        ..Case::DEFAULT
    }
);
row!(
    e_bind_13,
    Case {
        host: "workstation",
        args: &["bind", "01:00.0"],
        code: 1,
        needles: &["driverless after drivers_probe, not vfio-pci", "rolled back"],
        setup: refuse_bind,
        keep: Keep::Drivers,
        ..Case::DEFAULT
    }
);
row!(
    e_bind_14,
    Case {
        host: "workstation",
        args: &["bind", "01:00.0"],
        code: 1,
        needles: &[
            "IOMMU group 1 changed after the plan was made",
            "new member 0000:01:00.2",
            "rerun"
        ],
        env: &[("GPUPASS_FAKE_BEFORE_APPLY", "HOTPLUG")],
        keep: Keep::Drivers,
        ..Case::DEFAULT
    }
);
row!(
    e_bind_15,
    Case {
        host: "workstation",
        args: &["unbind", "01:00.0"],
        code: 1,
        needles: &["/dev/vfio/1", "pid 4242", "stop the VM or container"],
        setup: bound_and_open,
        ..Case::DEFAULT
    }
);
row!(
    e_bind_16,
    Case {
        host: "workstation",
        args: &["bind", "01:00.0"],
        code: 1,
        needles: &["journal /run/gpupass", "check that the directory is writable"],
        setup: run_is_file,
        ..Case::DEFAULT
    }
);
row!(
    e_bind_17,
    Case {
        host: "workstation",
        args: &["--from-json", "{root}/none.json", "persist", "01:00.0"],
        code: 2,
        needles: &["`gpupass persist` works on the live host; it cannot run from --from-json"],
        ..Case::DEFAULT
    }
);
row!(
    e_bind_18,
    Case {
        host: "workstation",
        args: &["persist", "42:00.0"],
        code: 1,
        needles: &["refusing to persist", "no such PCI device", "fix:"],
        ..Case::DEFAULT
    }
);
row!(
    e_bind_19,
    Case {
        // 17:00.0 is on vfio-pci without a journal entry. The fake kernel's record of the driver
        // that claims it on a probe (`.fake_native_driver`) says vfio-pci, as vfio-pci.ids= on
        // the kernel command line makes it: unbind clears the override, unbinds, reprobes, and
        // vfio-pci claims it again (lab/scenarios/vfioids.sh does it on the real kernel).
        host: "vfio-numa",
        args: &["unbind", "0000:17:00.0"],
        code: 1,
        needles: &[
            "0000:17:00.0 went back to vfio-pci on reprobe (vfio-pci.ids= on the kernel command line",
            "rolled back, nothing changed"
        ],
        setup: vfio_ids_claim_17,
        // The journal records the rollback; the driver is vfio-pci as before.
        keep: Keep::Drivers,
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_01,
    Case {
        host: "mdev-t4",
        args: &["mdev", "create", "-p", "3b:00.1", "-t", "nvidia-222"],
        code: 1,
        needles: &["no mdev parent \"3b:00.1\"", "did you mean \"0000:3b:00.0\"?"],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_02,
    Case {
        host: "workstation",
        args: &["mdev", "types", "--parent", "nope"],
        code: 1,
        needles: &["this host has none", "load the parent's driver"],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_03,
    Case {
        host: "mdev-t4",
        args: &["mdev", "create", "-p", "0000:3b:00.0", "-t", "nvidia-22"],
        code: 1,
        needles: &["has no mdev type \"nvidia-22\"", "valid types"],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_04,
    Case {
        host: "mdev-t4",
        args: &[
            "mdev",
            "create",
            "-p",
            "0000:3b:00.0",
            "-t",
            "nvidia-222",
            "--count",
            "16"
        ],
        code: 1,
        needles: &["no available instances of nvidia-222", "15 available, 16 wanted"],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_05,
    Case {
        host: "mdev-t4",
        args: &[
            "mdev",
            "create",
            "-p",
            "0000:3b:00.0",
            "-t",
            "nvidia-222",
            "-u",
            "2f3e4d5c-6b7a-4988-8776-655443322110"
        ],
        code: 1,
        needles: &[
            "mdev 2f3e4d5c-6b7a-4988-8776-655443322110 already exists",
            "omit --uuid"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_06,
    Case {
        host: "mdev-t4",
        args: &[
            "mdev",
            "create",
            "-p",
            "0000:3b:00.0",
            "-t",
            "nvidia-222",
            "-u",
            "11111111-2222-4333-8444-555555555555",
            "--count",
            "2"
        ],
        code: 2,
        needles: &["--uuid names one instance"],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_07,
    Case {
        host: "mdev-t4",
        args: &[
            "mdev",
            "create",
            "-p",
            "0000:3b:00.0",
            "-t",
            "nvidia-222",
            "-u",
            "not-a-uuid"
        ],
        code: 2,
        needles: &["is not a UUID"],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_08,
    Case {
        host: "mdev-t4",
        args: &[
            "mdev",
            "create",
            "-p",
            "0000:3b:00.0",
            "-t",
            "nvidia-222",
            "--attr",
            "x"
        ],
        code: 2,
        needles: &["is not NAME=VALUE"],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_09,
    Case {
        host: "mdev-t4",
        args: &["mdev", "remove", "11111111-2222-4333-8444-555555555555"],
        code: 1,
        needles: &[
            "no active mdev 11111111-2222-4333-8444-555555555555",
            "gpupass mdev list"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_10,
    Case {
        host: "mdev-t4",
        args: &["mdev", "remove", "2f3e4d5c-6b7a-4988-8776-655443322110"],
        code: 1,
        needles: &[
            "is in use: /dev/vfio/100 is open by qemu-system-x86 (pid 777)",
            "stop the VM"
        ],
        setup: qemu_holds_mdev,
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_11,
    Case {
        host: "mdev-lab",
        args: &["mdev", "start", "11111111-2222-4333-8444-555555555555"],
        code: 1,
        needles: &[
            "no definition for mdev 11111111-2222-4333-8444-555555555555",
            "--defined"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_12,
    Case {
        host: "mdev-lab",
        args: &[
            "mdev",
            "define",
            "-p",
            "mdpy",
            "-t",
            "mdpy-vga",
            "-u",
            "5e1a3b9c-0d2f-4e6a-8b7c-9d0e1f2a3b4c"
        ],
        code: 1,
        needles: &[
            "is already defined for parent mdpy",
            "/etc/mdevctl.d/mdpy/5e1a3b9c-0d2f-4e6a-8b7c-9d0e1f2a3b4c",
            "mdev undefine"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_13,
    Case {
        host: "mdev-lab",
        args: &["mdev", "define", "-p", "mdpy"],
        code: 2,
        needles: &["define needs both --parent and --type"],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_14,
    Case {
        host: "mdev-t4",
        args: &[
            "--from-json",
            "{root}/none.json",
            "mdev",
            "remove",
            "2f3e4d5c-6b7a-4988-8776-655443322110"
        ],
        code: 2,
        needles: &["`gpupass mdev remove` works on the live host; it cannot run from --from-json (drop it)"],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_20,
    Case {
        // The real-host code path (no fake kernel) over the fixture tree, whose `create` is a
        // plain file: it takes the write, as a parent driver that ignores the request does, and
        // no instance appears.
        host: "mdev-lab",
        env: &[("GPUPASS_FAKE_KERNEL", "0")],
        args: &[
            "mdev",
            "create",
            "-p",
            "mbochs",
            "-t",
            "mbochs-small",
            "--uuid",
            "11111111-2222-4333-8444-555555555555"
        ],
        code: 1,
        needles: &[
            "the kernel accepted 11111111-2222-4333-8444-555555555555 for /sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/create",
            "/sys/bus/mdev/devices/11111111-2222-4333-8444-555555555555 did not appear; nothing else was changed"
        ],
        // The one write went to the parent's `create`; every driver is as it was.
        keep: Keep::Drivers,
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_15,
    Case {
        host: "mdev-lab",
        args: &["mdev", "create", "-p", "mbochs", "-t", "mbochs-small"],
        code: 1,
        needles: &["cannot write", "/sys/", "create"],
        env: &[("GPUPASS_FAIL_WRITE", "1")],
        keep: Keep::Host,
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_16,
    Case {
        host: "mdev-t4",
        args: &[
            "mdev",
            "create",
            "-p",
            "0000:3b:00.0",
            "-t",
            "nvidia-222",
            "--attr",
            "frame_rate_limiter=0"
        ],
        code: 1,
        needles: &[
            "setting attribute frame_rate_limiter of mdev",
            "the instance was removed again"
        ],
        keep: Keep::Host,
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_17,
    Case {
        host: "mdev-lab",
        args: &["mdev", "undefine", "5e1a3b9c-0d2f-4e6a-8b7c-9d0e1f2a3b4c"],
        code: 1,
        needles: &["is defined for several parents", "add --parent"],
        setup: second_definition,
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_18,
    Case {
        host: "mdev-lab",
        args: &["mdev", "start", "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"],
        code: 1,
        needles: &["is already running on mbochs", "mdev stop"],
        ..Case::DEFAULT
    }
);
row!(
    e_mdev_19,
    Case {
        host: "mdev-lab",
        args: &["mdev", "start", "0f0e0d0c-0b0a-4908-8706-050403020100"],
        code: 1,
        needles: &["parent 0000:99:00.0 of mdev 0f0e0d0c-0b0a-4908-8706-050403020100 is not present"],
        setup: orphan_definition,
        ..Case::DEFAULT
    }
);
row!(
    e_out_01,
    Case {
        host: "workstation",
        args: &["xml", "hostdev", "zz:00.0"],
        code: 2,
        needles: &["invalid device \"zz:00.0\"", "mdev UUID"],
        ..Case::DEFAULT
    }
);
row!(
    e_out_02,
    Case {
        host: "workstation",
        args: &["kubevirt", "09:00.0"],
        code: 1,
        needles: &["no PCI device 0000:09:00.0 in the inventory"],
        ..Case::DEFAULT
    }
);
row!(
    e_out_03,
    Case {
        host: "workstation",
        args: &["qemu-args", "00:01.0"],
        code: 1,
        needles: &["0000:00:01.0 is a PCI bridge", "device behind it"],
        ..Case::DEFAULT
    }
);
row!(
    e_out_04,
    Case {
        host: "workstation",
        args: &["xml", "hostdev", "11111111-2222-4333-8444-555555555555"],
        code: 1,
        needles: &[
            "no mediated device 11111111-2222-4333-8444-555555555555",
            "create it first"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_out_05,
    Case {
        host: "workstation",
        args: &["qemu-args", "01:00.0"],
        code: 1,
        needles: &["0000:01:00.0 (nvidia)", "gpupass bind 0000:01:00.0"],
        ..Case::DEFAULT
    }
);
row!(
    e_out_06,
    Case {
        host: "nvidia-minors",
        args: &["xml", "hostdev", "07:00.0", "--managed"],
        code: 1,
        needles: &["has no IOMMU group", "gpupass check"],
        ..Case::DEFAULT
    }
);
row!(
    e_out_07,
    Case {
        host: "workstation",
        args: &[
            "xml",
            "hostdev",
            "01:00.0",
            "03:00.0",
            "--managed",
            "--guest-address",
            "0000:05:00.0"
        ],
        code: 2,
        needles: &["--guest-address places one device"],
        ..Case::DEFAULT
    }
);
row!(
    e_out_08,
    Case {
        host: "workstation",
        args: &[
            "xml",
            "hostdev",
            "01:00.0",
            "--managed",
            "--guest-address",
            "0000:05:00.1"
        ],
        code: 2,
        needles: &["must start at function 0", "use 0000:05:00.0"],
        ..Case::DEFAULT
    }
);
row!(
    e_out_09,
    Case {
        host: "workstation",
        args: &["xml", "hostdev", "01:00.0", "--managed", "--display"],
        code: 1,
        needles: &["display-capable"],
        ..Case::DEFAULT
    }
);
row!(
    e_out_10,
    Case {
        host: "workstation",
        args: &["qemu-args", "01:00.0", "--first-slot", "0x1f"],
        code: 2,
        needles: &["\"0x1f\" is not a usable pcie.0 slot", "0x01-0x1e"],
        ..Case::DEFAULT
    }
);
row!(
    e_out_21,
    Case {
        host: "workstation",
        args: &["qemu-args", "01:00.0", "--cpu", "host kvm=off"],
        code: 2,
        needles: &["\"host kvm=off\" is not a -cpu value", "host,kvm=off, or none"],
        ..Case::DEFAULT
    }
);
row!(
    e_out_22,
    Case {
        host: "workstation",
        args: &["qemu-args", "01:00.0", "--phys-bits", "65"],
        code: 2,
        needles: &["invalid value '65' for '--phys-bits <N>'", "32..=64"],
        ..Case::DEFAULT
    }
);
row!(
    e_out_11,
    Case {
        host: "hgx-8gpu",
        args: &[
            "qemu-args",
            "03:00.0",
            "04:00.0",
            "05:00.0",
            "06:00.0",
            "07:00.0",
            "83:00.0",
            "84:00.0",
            "85:00.0",
            "86:00.0",
            "--first-slot",
            "0x1e"
        ],
        code: 1,
        needles: &[
            "9 guest slots need root ports up to pcie.0 slot 0x1f",
            "past the last free q35 slot 0x1e",
            "--first-slot"
        ],
        setup: hgx_on_vfio,
        ..Case::DEFAULT
    }
);
row!(
    e_out_12,
    Case {
        host: "workstation",
        args: &["xml", "domain", "--name", "x", "--memory", "lots", "--vcpus", "1", "--device", "01:00.0"],
        code: 2,
        needles: &["not a size"],
        ..Case::DEFAULT
    }
);
row!(
    e_out_13,
    Case {
        host: "workstation",
        args: &[
            "attach",
            "--connect",
            "test:///default",
            "--domain",
            "vm1",
            "01:00.0"
        ],
        code: 1,
        needles: &["--features libvirt", "virsh attach-device"],
        setup: gpu_group_on_vfio,
        ..Case::DEFAULT
    }
);
row!(
    e_boot_01,
    Case {
        host: "workstation",
        args: &["boot", "--device", "01:00.0"],
        code: 1,
        needles: &[
            "0000:01:00.0 is bound to nvidia, not vfio-pci",
            "gpupass bind 0000:01:00.0"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_boot_02,
    Case {
        host: "workstation",
        args: &["boot", "--device", "42:00.0"],
        code: 1,
        needles: &["no PCI device 0000:42:00.0 on this host"],
        ..Case::DEFAULT
    }
);
row!(
    e_boot_03,
    Case {
        host: "workstation",
        args: &["boot", "--mdev", "11111111-2222-4333-8444-555555555555"],
        code: 1,
        needles: &[
            "no mediated device 11111111-2222-4333-8444-555555555555",
            "/sys/bus/mdev/devices/11111111-2222-4333-8444-555555555555"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_boot_04,
    Case {
        host: "workstation",
        args: &["boot", "--emulated"],
        code: 1,
        needles: &["/dev/kvm is not a character device"],
        ..Case::DEFAULT
    }
);
row!(
    e_boot_05,
    Case {
        host: "workstation",
        args: &["boot", "--emulated"],
        code: 1,
        needles: &["/dev/kvm does not exist", "modprobe kvm_intel"],
        setup: no_kvm,
        ..Case::DEFAULT
    }
);
row!(
    e_boot_06,
    Case {
        host: "workstation",
        args: &["boot", "--emulated", "--firmware", "{root}/nofw.bin"],
        code: 1,
        needles: &["cannot read firmware {root}/nofw.bin"],
        ..Case::DEFAULT
    }
);
row!(
    e_boot_07,
    Case {
        host: "workstation",
        args: &["boot", "--emulated", "--firmware", "{root}/empty.bin"],
        code: 2,
        needles: &["firmware is 0 bytes"],
        setup: empty_firmware,
        ..Case::DEFAULT
    }
);
row!(
    e_boot_08,
    Case {
        host: "workstation",
        args: &["boot", "--device", "01:00.0"],
        code: 1,
        needles: &["VFIO needs the live host"],
        setup: gpu_group_on_vfio,
        ..Case::DEFAULT
    }
);
row!(
    e_boot_09,
    Case {
        host: "workstation",
        args: &["boot", "--device", "01:00.0"],
        code: 1,
        needles: &["IOMMU group 1 is not viable", "0000:01:00.1 (snd_hda_intel)"],
        setup: gpu_only_on_vfio,
        ..Case::DEFAULT
    }
);
row!(
    e_boot_10,
    Case {
        // The real open of this machine's /dev/kvm (root:kvm, 0660) by a user outside the kvm
        // group: EACCES. The binary is copied where that user can run it (the test's temporary
        // directory), then run as nobody (65534) without supplementary groups.
        root: "/",
        args: &["boot", "--emulated", "--timeout", "5"],
        code: 1,
        needles: &[
            "gpupass: permission denied opening /dev/kvm: run as root, or add your user to the `kvm` group (`usermod -aG kvm $USER`"
        ],
        wrap: &["sh", "-c", AS_NOBODY, "{root}"],
        needs: &["setpriv", "kvm"],
        ..Case::DEFAULT
    }
);
row!(
    e_boot_13,
    Case {
        // The live root (`--root /`, what VFIO needs) in a mount namespace whose /sys is the
        // fixture's, where 17:00.0 is on vfio-pci in a viable group, and whose /dev holds the
        // fixture's VFIO nodes (regular files) beside the real /dev/kvm: every check passes,
        // KVM makes the VM, and vfio-ioctls' real open of the container fails on a node that is
        // not VFIO's (VFIO_GET_API_VERSION).
        host: "vfio-numa",
        root: "/",
        args: &[
            "boot",
            "--device",
            "0000:17:00.0",
            "--backend",
            "legacy",
            "--timeout",
            "5"
        ],
        code: 1,
        needles: &["gpupass: opening 0000:17:00.0 through VFIO failed: vfio API version"],
        setup: live_dev_dir,
        wrap: &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            VFIO_FIXTURE_NS,
            "{root}"
        ],
        needs: &["unshare", "mount", "kvm"],
        ..Case::DEFAULT
    }
);
row!(
    e_boot_14,
    Case {
        // A real KVM ioctl that fails: with 4 file descriptors the process can open /dev/kvm
        // but KVM_CREATE_VM cannot return the VM's (EMFILE). The emulated device needs no VFIO.
        root: "/",
        args: &["boot", "--emulated", "--timeout", "5"],
        code: 1,
        needles: &["gpupass: KVM create VM failed: Too many open files (os error 24)"],
        wrap: &["sh", "-c", "ulimit -n 4 && exec \"$0\" \"$@\""],
        needs: &["kvm"],
        ..Case::DEFAULT
    }
);

/// E-BOOT-13 through iommufd: the same namespace, `--backend iommufd`; /dev/iommu is the
/// fixture's regular file, so iommufd's first ioctl (IOMMU_IOAS_ALLOC) fails.
#[test]
fn e_boot_13_iommufd() {
    check(
        "E-BOOT-13",
        Case {
            host: "vfio-numa",
            root: "/",
            args: &[
                "boot",
                "--device",
                "0000:17:00.0",
                "--backend",
                "iommufd",
                "--timeout",
                "5",
            ],
            needles: &["gpupass: opening 0000:17:00.0 through VFIO failed: failed to new VfioIommufd"],
            setup: live_dev_dir,
            wrap: &[
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                VFIO_FIXTURE_NS,
                "{root}",
            ],
            needs: &["unshare", "mount", "kvm"],
            ..Case::DEFAULT
        },
    )
}
row!(
    e_snap_01,
    Case {
        host: "workstation",
        args: &["snapshot", "{root}/sys"],
        code: 1,
        needles: &["exists and is not empty", "choose a new directory"],
        ..Case::DEFAULT
    }
);
row!(
    e_snap_02,
    Case {
        host: "workstation",
        args: &["snapshot", "{root}/../snap-out-missing"],
        code: 1,
        needles: &["cannot list PCI devices at {root}/missing/sys/bus/pci/devices"],
        root: "{root}/missing",
        ..Case::DEFAULT
    }
);
row!(
    e_snap_03,
    Case {
        host: "workstation",
        args: &["snapshot", "{root}/sys/bus/pci/devices/0000:01:00.0/vendor/x"],
        code: 1,
        needles: &["cannot write snapshot at {root}/sys/bus/pci/devices/0000:01:00.0/vendor/x"],
        ..Case::DEFAULT
    }
);
row!(
    e_usage_10,
    Case {
        args: &["--log-format", "bogus", "list"],
        code: 2,
        needles: &[
            "invalid value 'bogus' for '--log-format <LOG_FORMAT>'",
            "[possible values: text, json]"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_usage_11,
    Case {
        args: &["--color", "bogus", "list"],
        code: 2,
        needles: &[
            "invalid value 'bogus' for '--color <COLOR>'",
            "[possible values: auto, always, never]"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_usage_12,
    Case {
        args: &["--verbose=2", "list"],
        code: 2,
        needles: &["unexpected value '2' for '--verbose...' found; no more were expected"],
        ..Case::DEFAULT
    }
);
row!(
    e_usage_13,
    Case {
        args: &["completions", "tcsh"],
        code: 2,
        needles: &[
            "invalid value 'tcsh' for '<SHELL>'",
            "[possible values: bash, zsh, fish]"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_usage_14,
    Case {
        args: &["--from-json", "{root}/saved.json", "startup"],
        code: 2,
        needles: &["`gpupass startup` works on the live host; it cannot run from --from-json"],
        setup: persisted_gpu,
        ..Case::DEFAULT
    }
);
row!(
    e_cdi_01,
    Case {
        host: "legacy-bridge",
        args: &["cdi", "generate"],
        needles: &[
            "nothing to describe: no IOMMU group is held by vfio-pci",
            "bind a device to vfio-pci first"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_backend_01,
    Case {
        host: "hgx-8gpu",
        args: &["qemu-args", "03:00.0", "--backend", "iommufd"],
        code: 1,
        needles: &[
            "--backend iommufd: this host cannot use iommufd",
            "kernel 6.1 predates the VFIO device cdev (6.6)",
            "Linux 6.6 or newer",
            "use --backend legacy or auto"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_backend_05,
    Case {
        host: "vfio-numa",
        args: &[
            "qemu-args",
            "4b:00.0",
            "--backend",
            "iommufd",
            "--qemu-version",
            "8.1"
        ],
        code: 1,
        needles: &[
            "--backend iommufd: the QEMU 8.1 (from --qemu-version) cannot open VFIO devices through iommufd",
            "need QEMU 8.2",
            "--qemu BINARY or --qemu-version (8.2 or newer), or use --backend legacy or auto"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_backend_06,
    Case {
        host: "vfio-numa",
        args: &["qemu-args", "4b:00.0", "--qemu-version", "8"],
        code: 2,
        needles: &[
            "invalid value '8' for '--qemu-version <X.Y>'",
            "expected MAJOR.MINOR[.MICRO] like 8.2 or 10.0.2"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_backend_02,
    Case {
        host: "vfio-numa",
        args: &["xml", "hostdev", "4b:00.0", "--backend", "iommufd", "--libvirt-version", "9.0"],
        code: 1,
        needles: &[
            "--backend iommufd: the target libvirt 9.0 (from --libvirt-version) cannot open hostdevs through iommufd",
            "<driver iommufd='yes'/> on a hostdev needs libvirt 12.1",
            "the domain-wide <iommufd enabled='yes'/> 12.2",
            "use --backend legacy or auto"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_backend_03,
    Case {
        host: "vfio-numa",
        args: &["xml", "hostdev", "4b:00.0", "--libvirt-version", "twelve"],
        code: 2,
        needles: &[
            "invalid value 'twelve' for '--libvirt-version <X.Y>'",
            "expected MAJOR.MINOR[.MICRO] like 12.1 or 9.0.0"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_backend_04,
    Case {
        host: "vfio-numa",
        args: &["kubevirt", "4b:00.0", "--backend", "iommufd"],
        code: 2,
        needles: &[
            "--backend iommufd needs --external-provider",
            "KubeVirt's own PCI device plugin hands out the group node",
            "gpupass device-plugin --backend iommufd"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_cdi_02,
    Case {
        host: "vfio-numa",
        args: &["cdi", "generate", "--cdi-version", "0.3.0"],
        code: 2,
        needles: &[
            "--cdi-version 0.3.0 is too old for this spec",
            "needs cdiVersion 0.5.0 or newer; pin 0.5.0 or drop --cdi-version"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_cdi_03,
    Case {
        host: "vfio-numa",
        args: &["cdi", "generate", "--cdi-version", "9.9"],
        code: 2,
        needles: &[r#"invalid value '9.9' for '--cdi-version <V>': unknown CDI version "9.9"; known: 0.3.0"#],
        ..Case::DEFAULT
    }
);
row!(
    e_cdi_04,
    Case {
        host: "vfio-numa",
        args: &["cdi", "generate", "--kind", "a/b/c"],
        code: 2,
        needles: &[
            r#"invalid value 'a/b/c' for '--kind <K>': invalid CDI kind "a/b/c": expected vendor/class like gpupass.dev/pci"#
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_cdi_05,
    Case {
        host: "vfio-numa",
        args: &["cdi", "generate", "--write", "--output", "{root}/spec.json"],
        code: 2,
        needles: &["cannot be used with"],
        ..Case::DEFAULT
    }
);
row!(
    e_cdi_06,
    Case {
        args: &["cdi", "generate", "--write"],
        needles: &["cannot write /var/run/cdi/gpupass.json; is the directory writable (root)?: "],
        setup: var_run_cdi_is_file,
        // The spec is a file write of the change engine: the failed write leaves its
        // `rolled_back` record in the journal, and the host as it was.
        keep: Keep::Host,
        ..Case::DEFAULT
    }
);
row!(
    e_cdi_07,
    Case {
        args: &["cdi", "generate", "--output", "{root}/sys"],
        needles: &["cannot write {root}/sys: Is a directory"],
        ..Case::DEFAULT
    }
);
row!(
    e_cont_01,
    Case {
        args: &["container", "list", "--device", "0000:99:00.0"],
        needles: &["no PCI function 0000:99:00.0 on this host; `gpupass list` shows the GPUs"],
        ..Case::DEFAULT
    }
);
row!(
    e_cont_02,
    Case {
        args: &["container", "list", "--device", "00:02.0"],
        needles: &[
            "0000:00:02.0 is bound to i915, not to the native nvidia driver",
            "`gpupass cdi generate`, `gpupass oci-hook`"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_cont_03,
    Case {
        args: &["container", "list", "--device", "01:00.0"],
        needles: &["0000:01:00.0 is on the nvidia driver but /proc/driver/nvidia/gpus/0000:01:00.0/information has no Device Minor"],
        setup: nvidia_without_minor,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_01,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        code: 2,
        stdin: "{",
        needles: &[
            "gpupass oci-hook: malformed OCI state on stdin: EOF while parsing",
            r#"the runtime passes {"ociVersion", "id", "pid", "bundle", ...}"#
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_hook_02,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        code: 2,
        stdin: r#"{"ociVersion":"","id":"c1","pid":4242,"bundle":"{root}/bundle"}"#,
        needles: &["malformed OCI state on stdin: ociVersion and id must not be empty"],
        setup: bundle,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_03,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        code: 2,
        stdin: r#"{"ociVersion":"1.0.2","id":"c1","pid":4242,"bundle":"bundle"}"#,
        needles: &[r#"malformed OCI state on stdin: bundle "bundle" is not an absolute path"#],
        ..Case::DEFAULT
    }
);
row!(
    e_hook_04,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        code: 2,
        stdin: r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":0,"bundle":"{root}/bundle","annotations":{"gpupass.dev/devices":"40"}}"#,
        needles: &["malformed OCI state on stdin: no pid: run gpupass as a createRuntime (or prestart) hook"],
        setup: bundle,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_05,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: STATE_GROUP_40,
        needles: &["gpupass oci-hook: bundle {root}/bundle: cannot read config.json"],
        setup: bundle_without_config,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_06,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: STATE_GROUP_40,
        needles: &["bundle {root}/bundle: config.json is not JSON"],
        setup: bundle_config_not_json,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_07,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: STATE_GROUP_40,
        needles: &["bundle {root}/bundle: config.json has no root.path"],
        setup: bundle_without_root_path,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_08,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: STATE_GROUP_40,
        needles: &["bundle {root}/bundle: root.path {root}/bundle/nothere is not a directory"],
        setup: bundle_rootfs_missing,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_09,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        code: 2,
        stdin: r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":4242,"bundle":"{root}/bundle","annotations":{"gpupass.dev/devices":"17:00.0,x"}}"#,
        needles: &[
            r#"annotation gpupass.dev/devices="17:00.0,x": "x" is neither a PCI address (0000:01:00.0) nor an IOMMU group number"#
        ],
        setup: bundle,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_24,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        code: 2,
        stdin: r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":4242,"bundle":"{root}/bundle","annotations":{"gpupass.dev/devices":"40","gpupass.dev/backend":"both"}}"#,
        needles: &[
            r#"gpupass oci-hook: annotation gpupass.dev/backend="both": expected legacy, iommufd or auto"#
        ],
        setup: bundle,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_25,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":4242,"bundle":"{root}/bundle","annotations":{"gpupass.dev/devices":"40","gpupass.dev/backend":"iommufd"}}"#,
        needles: &[
            "gpupass oci-hook: --backend iommufd (annotation gpupass.dev/backend): IOMMU group 40 cannot use iommufd: /dev/iommu does not exist",
            "Linux 6.6 or newer",
            "use legacy or auto"
        ],
        setup: bundle_without_dev_iommu,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_10,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":4242,"bundle":"{root}/bundle","annotations":{"gpupass.dev/devices":"0000:99:00.0,999"}}"#,
        needles: &[
            "PCI function 0000:99:00.0 is not on this host; `gpupass groups` lists the groups and devices"
        ],
        setup: bundle,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_11,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":4242,"bundle":"{root}/bundle","annotations":{"gpupass.dev/devices":"0000:b1:00.0"}}"#,
        needles: &["0000:b1:00.0 is bound to nvidia, not to vfio-pci; run `gpupass bind 0000:b1:00.0` first"],
        setup: bundle,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_12,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":4242,"bundle":"{root}/bundle","annotations":{"gpupass.dev/devices":"50"}}"#,
        needles: &["IOMMU group 50 has no function on vfio-pci; `gpupass bind` its functions first"],
        setup: bundle,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_13,
    Case {
        host: "workstation",
        args: &["oci-hook"],
        stdin: r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":4242,"bundle":"{root}/bundle","annotations":{"gpupass.dev/devices":"01:00.0"}}"#,
        needles: &["IOMMU group 1 is not viable: 0000:01:00.1 (snd_hda_intel) still on host drivers; bind the whole group to vfio-pci"],
        setup: bundle_gpu_only_on_vfio,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_14,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: STATE_GROUP_40,
        needles: &[
            "host device node /dev/vfio/40 is missing: is the vfio module loaded and the device bound?"
        ],
        setup: bundle_no_group_node,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_15,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: STATE_GROUP_40,
        needles: &["host path /dev/iommu is not a character device; the hook needs the live host's /dev"],
        setup: bundle,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_16,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: STATE_GROUP_40,
        needles: &["cannot read /proc/4242/cgroup: No such file or directory"],
        setup: bundle_char_nodes,
        ..Case::DEFAULT
    }
);
// Cgroup v1: the devices.allow rules written before entering the namespace are taken back
// through devices.deny, so the whole tree (devices.list included) is as before.
row!(
    e_hook_17,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: STATE_GROUP_40,
        needles: &[
            "cannot enter the mount namespace of pid 4242: Invalid argument (os error 22); run the hook as root from the runtime's createRuntime (or prestart) hooks"
        ],
        setup: container_v1_ns_fails,
        ..Case::DEFAULT
    }
);

/// E-HOOK-17 in an allow-all cgroup: nothing written to devices.allow or devices.deny (the
/// tree, devices.list included, is as before). A hook that denied its rules here once took
/// /dev/vfio/vfio away from every process sharing the cgroup.
#[test]
fn e_hook_17_in_an_allow_all_cgroup() {
    check(
        "E-HOOK-17",
        Case {
            host: "vfio-numa",
            args: &["oci-hook"],
            stdin: STATE_GROUP_40,
            needles: &[
                "cannot enter the mount namespace of pid 4242: Invalid argument (os error 22); run the hook as root from the runtime's createRuntime (or prestart) hooks"
            ],
            setup: container_v1_allow_all_ns_fails,
            ..Case::DEFAULT
        },
    )
}

/// E-HOOK-17 before any write: no namespace file at all (cgroup v2).
#[test]
fn e_hook_17_without_ns_file() {
    check(
        "E-HOOK-17",
        Case {
            host: "vfio-numa",
            args: &["oci-hook"],
            stdin: STATE_GROUP_40,
            needles: &[
                "cannot enter the mount namespace of pid 4242: /proc/4242/ns/mnt: No such file or directory",
                "run the hook as root from the runtime's createRuntime (or prestart) hooks",
            ],
            setup: container_without_ns,
            ..Case::DEFAULT
        },
    )
}

/// E-HOOK-18 after a first rule: the second devices.allow write fails, the first is taken back.
#[test]
fn e_hook_18_after_a_first_rule() {
    check(
        "E-HOOK-18",
        Case {
            host: "vfio-numa",
            args: &["oci-hook"],
            env: &[("GPUPASS_FAIL_WRITE", "2")],
            stdin: STATE_GROUP_40,
            needles: &[
                "cannot allow the devices in cgroup /sys/fs/cgroup/devices/ctr/devices.allow; run the hook as root, with the cgroup v1 devices controller mounted: injected failure at write 2",
            ],
            setup: container_v1_two_rules,
            ..Case::DEFAULT
        },
    )
}
row!(
    e_hook_18,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: STATE_GROUP_40,
        needles: &["cannot allow the devices in cgroup /sys/fs/cgroup/devices/ctr/devices.allow; run the hook as root, with the cgroup v1 devices controller mounted: No such file or directory"],
        setup: container_v1_without_controller,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_23,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: STATE_GROUP_40,
        needles: &[
            "gpupass oci-hook: cannot allow the devices in cgroup /sys/fs/cgroup/ctr (cgroup v2 device filter): cannot open it: No such file or directory (os error 2); run the hook as root (CAP_SYS_ADMIN and CAP_BPF) on a kernel with CONFIG_CGROUP_BPF, or request the devices through CDI"
        ],
        setup: container_v2_no_cgroup,
        ..Case::DEFAULT
    }
);

/// E-HOOK-23 from the kernel: the directory is no cgroup, BPF_PROG_QUERY refuses it.
#[test]
fn e_hook_23_not_a_cgroup() {
    check(
        "E-HOOK-23",
        Case {
            host: "vfio-numa",
            args: &["oci-hook"],
            stdin: STATE_GROUP_40,
            needles: &[
                "cannot allow the devices in cgroup /sys/fs/cgroup/ctr (cgroup v2 device filter): BPF_PROG_QUERY (device programs of the cgroup): ",
                "run the hook as root",
            ],
            setup: container_v2_not_a_cgroup,
            ..Case::DEFAULT
        },
    )
}
row!(
    e_hook_22,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        stdin: STATE_GROUP_40,
        needles: &[
            "gpupass oci-hook: cannot enter the mount namespace of pid 4242: Invalid argument (os error 22); run the hook as root",
            "; and the devices cgroup still allows c 1:3 rwm: taking it back through /sys/fs/cgroup/devices/ctr/devices.deny failed; the runtime drops it with the failed container's cgroup: No such file or directory (os error 2)"
        ],
        setup: container_v1_ns_fails_no_deny,
        keep: Keep::Drivers,
        ..Case::DEFAULT
    }
);
row!(
    e_hook_19,
    Case {
        host: "vfio-numa",
        args: &["oci-hook"],
        root: "{root}/nope",
        stdin: STATE_GROUP_40,
        needles: &[
            "gpupass oci-hook: cannot list PCI devices at {root}/nope/sys/bus/pci/devices",
            "(or is --root right)?"
        ],
        setup: bundle,
        ..Case::DEFAULT
    }
);
row!(
    e_dp_01,
    Case {
        host: "vfio-numa",
        root: "{root}/nope",
        args: &["device-plugin"],
        needles: &["cannot list PCI devices at {root}/nope/sys/bus/pci/devices"],
        ..Case::DEFAULT
    }
);
row!(
    e_dp_02,
    Case {
        host: "vfio-numa",
        args: &["device-plugin", "--socket-dir", "{root}/sys/bus/pci/devices/0000:17:00.0/vendor/plugins"],
        needles: &["cannot create the socket directory {root}/sys/bus/pci/devices/0000:17:00.0/vendor/plugins; give --socket-dir a directory gpupass can create sockets in (the kubelet's is /var/lib/kubelet/device-plugins): Not a directory (os error 20)"],
        ..Case::DEFAULT
    }
);
row!(
    e_dp_03,
    Case {
        host: "vfio-numa",
        args: &["device-plugin", "--poll-ms", "5"],
        code: 2,
        needles: &["invalid value '5' for '--poll-ms <POLL_MS>': 5 is not in 10..=10000"],
        ..Case::DEFAULT
    }
);
row!(
    e_dp_04,
    Case {
        host: "vfio-numa",
        args: &["device-plugin", "--cdi", "bogus"],
        code: 2,
        needles: &[
            "invalid value 'bogus' for '--cdi <CDI>'",
            "[possible values: auto, always, never, only]"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_start_01,
    Case {
        args: &["startup"],
        needles: &[
            "gpupass startup: refusing to bind (1 problem):",
            "0000:00:01.0: is a PCI bridge"
        ],
        setup: persisted_bridge,
        ..Case::DEFAULT
    }
);
row!(
    e_start_02,
    Case {
        args: &["startup"],
        env: &[("GPUPASS_FAIL_WRITE", "1")],
        needles: &[
            r#"gpupass startup: bind step 2 (write "vfio-pci" > /sys/bus/pci/devices/0000:01:00.0/driver_override) failed"#,
            "rolled back, nothing changed"
        ],
        setup: persisted_gpu,
        keep: Keep::Drivers,
        ..Case::DEFAULT
    }
);
row!(
    e_cdi_08,
    Case {
        host: "vfio-numa",
        args: &["cdi", "generate", "--watch"],
        code: 2,
        needles: &["the following required arguments were not provided", "--write"],
        ..Case::DEFAULT
    }
);

row!(
    e_launch_01,
    Case {
        host: "vfio-numa",
        args: &["launch", "--device", "17:00.0", "--", "/bin/true"],
        code: 1,
        needles: &[
            "gpupass launch opens the live host's /dev/iommu",
            "cannot run against --root",
            "(drop --root)"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_launch_02,
    Case {
        host: "mdev-t4",
        args: &[
            "launch",
            "--device",
            "2f3e4d5c-6b7a-4988-8776-655443322110",
            "--",
            "/bin/true"
        ],
        code: 2,
        needles: &[
            "passes PCI functions (their cdevs), not mdev 2f3e4d5c-6b7a-4988-8776-655443322110",
            "gpupass qemu-args"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_out_15,
    Case {
        host: "workstation",
        args: &["qemu-args", "01:00.0"],
        code: 1,
        needles: &[
            "a 64-bit PCI window of 128G (for 2 64-bit BAR(s), 32.03 GiB in all) over QEMU's default guest RAM (no --memory) ends at 256G",
            "OVMF places it above guest RAM, aligned to its own size, at 128G-256G, so it needs 38 physical address bits, but the guest gets this host CPU's 36",
            "pass fewer devices, or a smaller window with --pci-hole64 SIZE (at most 32G over this RAM)",
            "nothing was written"
        ],
        setup: gpu_group_on_vfio_36_bits,
        ..Case::DEFAULT
    }
);
row!(
    e_out_17,
    Case {
        host: "hgx-8gpu",
        args: &[
            "xml", "domain", "--name", "h", "--memory", "128G", "--vcpus", "8", "--managed", "--hugepages", "1G",
            "--device", "83:00.0"
        ],
        code: 1,
        needles: &[
            "--hugepages 1G: the guest needs 128 free 1G pages on host node 1 (131072 MiB), which has 64 free of 512 reserved",
            "/sys/devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages",
            "nothing was written"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_out_18,
    Case {
        host: "hgx-8gpu",
        args: &[
            "xml",
            "domain",
            "--name",
            "h",
            "--memory",
            "1536M",
            "--vcpus",
            "8",
            "--managed",
            "--hugepages",
            "1G",
            "--device",
            "03:00.0"
        ],
        code: 1,
        needles: &[
            "--hugepages 1G: guest memory of 1536 MiB is not a whole number of 1G pages",
            "a multiple of 1024 MiB",
            "nothing was written"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_out_19,
    Case {
        host: "hgx-8gpu",
        args: &["xml", "domain", "--name", "h", "--memory", "8G", "--vcpus", "8", "--managed", "--device", "03:00.0"],
        code: 1,
        needles: &[
            "a 64-bit PCI window of 512G (for 3 64-bit BAR(s), 128.05 GiB in all) over 8 GiB of guest RAM ends at 1T",
            "so it needs 40 physical address bits, but this host's IOMMU translates 39",
            "so VFIO could not map the BARs for peer-to-peer DMA",
            "--pci-hole64 SIZE (at most 256G over this RAM)",
            "nothing was written"
        ],
        setup: iommu_39_bits,
        ..Case::DEFAULT
    }
);
row!(
    e_out_20,
    Case {
        host: "vfio-numa",
        args: &[
            "qemu-args",
            "--memory",
            "4G",
            "--vcpus",
            "1",
            "--backend",
            "legacy",
            "17:00.0",
            "ca:00.0"
        ],
        code: 1,
        needles: &[
            "the devices span host NUMA nodes 0, 1, so the guest gets one NUMA node per host node",
            "--vcpus 1 is fewer than 2",
            "or --numa off; nothing was written"
        ],
        ..Case::DEFAULT
    }
);
row!(
    e_out_16,
    Case {
        host: "vfio-numa",
        args: &[
            "xml",
            "domain",
            "--name",
            "n",
            "--memory",
            "4G",
            "--vcpus",
            "4",
            "--backend",
            "legacy",
            "--numa",
            "strict",
            "--device",
            "17:00.0",
            "ca:00.0"
        ],
        code: 1,
        needles: &[
            "--numa strict: the devices are on host NUMA nodes 0, 1",
            "nothing was written"
        ],
        ..Case::DEFAULT
    }
);
