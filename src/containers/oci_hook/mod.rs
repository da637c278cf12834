//! `gpupass oci-hook`: an OCI runtime hook (`createRuntime`, or the deprecated `prestart`)
//! that gives a container the VFIO device nodes named by its `gpupass.dev/devices`
//! annotation (comma-separated PCI addresses and/or IOMMU group numbers).
//!
//! The runtime runs the hook in the host's namespaces with the OCI state on stdin
//! (`{"ociVersion", "id", "status", "pid", "bundle", "annotations"}`). At that point the
//! container's root filesystem is mounted (under the path from `config.json`), but only in the
//! container's mount namespace: the runtime mounted a tmpfs over its `/dev` there, so nodes
//! made from the host's view would be hidden. The hook therefore:
//!
//! 1. reads and checks everything first (state, bundle `config.json`, annotation, inventory:
//!    every requested function bound to a VFIO driver, its group viable, every host node a
//!    character device). Any problem: a clear message on stderr, a non-zero exit, nothing
//!    created;
//! 2. allows the nodes in the container's devices cgroup (v1: `c MAJ:MIN rwm` into
//!    `devices.allow` of the cgroup named in `/proc/<pid>/cgroup`; when a later step fails the
//!    same rules go to `devices.deny`, and a failure of that is reported). On cgroup v2 device
//!    access is the eBPF program(s) the runtime attached to that cgroup: each is replaced,
//!    atomically, by one that allows the nodes and otherwise runs the runtime's instructions
//!    unchanged (`bpf.rs`); a later failure swaps the runtime's programs back;
//! 3. joins the container's mount namespace (`setns` on `/proc/<pid>/ns/mnt`, see `ns.rs`) and
//!    creates the nodes under the rootfs with the host nodes' type, numbers, mode and owner,
//!    walking the path one component at a time with `O_NOFOLLOW`, so a symlink planted in the
//!    image (`/dev -> /host`) can never redirect it out of the rootfs.
//!
//! Without the annotation the hook does nothing, so it can be installed for every container.

#[allow(unsafe_code)] // bpf(2) calls (the crate denies unsafe_code elsewhere: src/lib.rs)
pub mod bpf;
mod ns;

use crate::host::ops::HostOps;
use crate::host::HostRoot;
use crate::inventory::backend::{self, Policy};
use crate::model::{Backend, Inventory, NotReady, PciAddress};
use serde::Deserialize;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The annotation that requests devices.
pub(crate) const ANNOTATION: &str = "gpupass.dev/devices";
/// The annotation that picks the VFIO backend: `legacy`, `iommufd` or `auto` (the default;
/// docs/iommufd.md).
pub(crate) const BACKEND_ANNOTATION: &str = "gpupass.dev/backend";

/// Why the hook refused.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("malformed OCI state on stdin: {reason}; the runtime passes {{\"ociVersion\", \"id\", \"pid\", \"bundle\", ...}}")]
    BadState { reason: String },
    #[error("bundle {}: {reason}", .path.display())]
    Bundle { path: PathBuf, reason: String },
    #[error("annotation {ANNOTATION}={value:?}: {item:?} is neither a PCI address (0000:01:00.0) nor an IOMMU group number")]
    BadRequest { value: String, item: String },
    #[error("{what} is not on this host; `gpupass groups` lists the groups and devices")]
    Unknown { what: String },
    #[error("{addr} is bound to {driver}, not to vfio-pci; run `gpupass bind {addr}` first")]
    NotVfio { addr: PciAddress, driver: String },
    #[error("IOMMU group {group} has no function on vfio-pci; `gpupass bind` its functions first (`gpupass groups` lists them)")]
    GroupNotVfio { group: u32 },
    #[error("IOMMU group {group} is not viable: {blockers} still on host drivers; bind the whole group to vfio-pci")]
    NotViable { group: u32, blockers: String },
    #[error("host device node {} is missing: is the vfio module loaded and the device bound?", .path.display())]
    NoNode { path: PathBuf },
    #[error("host path {} is not a character device; the hook needs the live host's /dev (is --root a snapshot or fixture tree?)", .path.display())]
    NotCharDevice { path: PathBuf },
    #[error("cannot read {}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot allow the devices in cgroup {}; run the hook as root, with the cgroup v1 devices controller mounted", .path.display())]
    Cgroup {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot enter the mount namespace of pid {pid}: {reason}; run the hook as root from the runtime's createRuntime (or prestart) hooks, while the container's process exists")]
    Namespace { pid: u32, reason: String },
    #[error("{}; and the devices cgroup still allows {rules}: taking {them} back through {path} failed; the runtime drops {them} with the failed container's cgroup", crate::model::ErrorChain(.error.as_ref()))]
    NotRevoked {
        error: Box<HookError>,
        rules: String,
        them: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing {} under the rootfs: {reason}", .path.display())]
    Unsafe { path: PathBuf, reason: String },
    #[error("cannot create {} in the container: {reason}", .path.display())]
    Create { path: PathBuf, reason: String },
    #[error("cannot allow the devices in cgroup {} (cgroup v2 device filter): {reason}; run the hook as root (CAP_SYS_ADMIN and CAP_BPF) on a kernel with CONFIG_CGROUP_BPF, or request the devices through CDI, which has the runtime put them in its own filter", .cgroup.display())]
    Bpf { cgroup: PathBuf, reason: String },
    #[error("annotation {BACKEND_ANNOTATION}={value:?}: expected legacy, iommufd or auto")]
    BadBackend { value: String },
    #[error("--backend iommufd (annotation {BACKEND_ANNOTATION}): {what} cannot use iommufd: {reason}; {}; use legacy or auto", crate::inventory::backend::IOMMUFD_NEEDS)]
    NoIommufd { what: String, reason: String },
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
}

impl HookError {
    /// The hook's wording of the model's readiness reasons for the function `addr`.
    fn not_ready(addr: PciAddress, e: NotReady) -> HookError {
        match e {
            NotReady::NotOnVfio { driver } => HookError::NotVfio {
                addr,
                driver: driver.unwrap_or_else(|| "no driver".into()),
            },
            NotReady::NotViable { group, .. } => HookError::not_viable(group, &e),
            NotReady::NoGroup | NotReady::NoNode { .. } => HookError::Unknown {
                what: format!("the IOMMU group of {addr}"),
            },
        }
    }

    fn not_viable(group: u32, e: &NotReady) -> HookError {
        HookError::NotViable {
            group,
            blockers: e.blocker_list(),
        }
    }

    /// 2 for malformed input (state, annotation), 1 for everything else.
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            HookError::BadState { .. } | HookError::BadRequest { .. } | HookError::BadBackend { .. } => 2,
            HookError::NotRevoked { error, .. } => error.exit_code(),
            _ => 1,
        }
    }
}

/// The OCI state (runtime-spec "State").
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    pub oci_version: String,
    pub id: String,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub pid: Option<u32>,
    pub bundle: String,
    #[serde(default)]
    pub annotations: HashMap<String, String>,
}

/// One requested item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Device(PciAddress),
    Group(u32),
}

/// Parse the annotation value: `0000:17:00.0, 42`.
pub fn parse_request(value: &str) -> Result<Vec<Request>, HookError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim) {
        let r = if !item.is_empty() && item.bytes().all(|b| b.is_ascii_digit()) {
            item.parse().map(Request::Group).ok()
        } else {
            item.parse().map(Request::Device).ok()
        };
        match r {
            Some(r) if !out.contains(&r) => out.push(r),
            Some(_) => {}
            None => {
                return Err(HookError::BadRequest {
                    value: value.into(),
                    item: item.into(),
                })
            }
        }
    }
    Ok(out)
}

/// The device nodes (container paths, `/dev/...`) a request needs, one backend's set per
/// request (`backend::choose` under `policy`): legacy the group node and the container,
/// iommufd `/dev/iommu` and the requested functions' cdevs (a group: its VFIO members').
/// Pure over the inventory.
pub(crate) fn plan(inv: &Inventory, reqs: &[Request], policy: Policy) -> Result<Vec<String>, HookError> {
    let mut nodes: Vec<String> = Vec::new();
    let mut add = |p: String| {
        if !nodes.contains(&p) {
            nodes.push(p);
        }
    };
    for r in reqs {
        let (group, devices) = match r {
            Request::Device(a) => {
                let d = inv.device(a).ok_or_else(|| HookError::Unknown {
                    what: format!("PCI function {a}"),
                })?;
                let g = inv.vfio_group(d).map_err(|e| HookError::not_ready(*a, e))?;
                (g, vec![d])
            }
            Request::Group(n) => {
                let g = inv.group(*n).ok_or_else(|| HookError::Unknown {
                    what: format!("IOMMU group {n}"),
                })?;
                let devs: Vec<_> = g
                    .members
                    .iter()
                    .filter_map(|a| inv.device(a))
                    .filter(|d| d.check_vfio_driver().is_ok())
                    .collect();
                if devs.is_empty() {
                    return Err(HookError::GroupNotVfio { group: *n });
                }
                g.check_viable().map_err(|e| HookError::not_viable(*n, &e))?;
                (g, devs)
            }
        };
        // One backend for the whole request: the one every requested function has.
        let picks: Vec<Option<Backend>> = devices.iter().map(|d| backend::choose(policy, d)).collect();
        let chosen = match picks.first().copied().flatten() {
            Some(b) if picks.iter().all(|p| *p == Some(b)) => Some(b),
            // Under auto, functions that differ fall back to what serves them all.
            _ if policy == Policy::Auto && devices.iter().all(|d| d.backends.contains(&Backend::Legacy)) => {
                Some(Backend::Legacy)
            }
            _ => None,
        };
        let Some(b) = chosen else {
            if policy == Policy::Iommufd {
                let d = devices
                    .iter()
                    .find(|d| !d.backends.contains(&Backend::Iommufd))
                    .unwrap_or(&devices[0]);
                return Err(HookError::NoIommufd {
                    what: match r {
                        Request::Device(a) => a.to_string(),
                        Request::Group(n) => format!("IOMMU group {n}"),
                    },
                    reason: backend::why_not_iommufd(inv, d),
                });
            }
            return Err(HookError::NoNode {
                path: PathBuf::from(format!("/dev/vfio/{}", group.number)),
            });
        };
        for p in backend::nodes(b, group.number, &devices) {
            add(p);
        }
    }
    Ok(nodes)
}

/// A node to create: container path and the host node's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    pub path: String,
    pub major: u64,
    pub minor: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

fn host_node(host: &HostRoot, path: &str) -> Result<Node, HookError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let p = host.path(path);
    let m = std::fs::metadata(&p).map_err(|_| HookError::NoNode { path: path.into() })?;
    if !m.file_type().is_char_device() {
        return Err(HookError::NotCharDevice {
            path: host.display(&p).into(),
        });
    }
    let rdev = m.rdev();
    Ok(Node {
        path: path.into(),
        major: u64::from(rustix::fs::major(rdev)),
        minor: u64::from(rustix::fs::minor(rdev)),
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
    })
}

/// Which cgroup hierarchy holds the process's device rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceCgroup {
    /// v1: the `devices` controller path of the process.
    V1(String),
    /// v2 (unified): the cgroup path; device rules are eBPF programs attached to it.
    V2(String),
}

/// Parse `/proc/<pid>/cgroup` (`ID:controllers:path` lines).
pub fn device_cgroup(text: &str) -> Option<DeviceCgroup> {
    let mut unified = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        if ctrl.split(',').any(|c| c == "devices") {
            return Some(DeviceCgroup::V1(path.to_string()));
        }
        if ctrl.is_empty() {
            unified = Some(DeviceCgroup::V2(path.to_string()));
        }
    }
    unified
}

/// The directory of a cgroup v2 path: under `/sys/fs/cgroup` when that is the unified
/// hierarchy, else under `/sys/fs/cgroup/unified` (the hybrid layout).
fn v2_dir(host: &HostRoot, rel: &str) -> PathBuf {
    let root = host.cgroup_root();
    let base = if root.join("cgroup.controllers").exists() {
        root
    } else {
        root.join("unified")
    };
    base.join(rel.trim_start_matches('/'))
}

/// Whether config.json's `linux.resources.devices` allows a char node (for cgroup v2).
fn config_allows(config: &serde_json::Value, n: &Node) -> bool {
    let rules = config["linux"]["resources"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut allowed = false;
    for r in rules {
        let ty = r["type"].as_str().unwrap_or("a");
        let maj = r["major"].as_u64();
        let min = r["minor"].as_u64();
        let access = r["access"].as_str().unwrap_or("rwm");
        if (ty == "a" || ty == "c")
            && !matches!(maj, Some(m) if m != n.major)
            && !matches!(min, Some(m) if m != n.minor)
            && access.contains('r')
            && access.contains('w')
        {
            allowed = r["allow"].as_bool().unwrap_or(false);
        }
    }
    allowed
}

/// What the hook did.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub created: Vec<String>,
    pub notes: Vec<String>,
}

/// The OCI state on stdin, at most 1 MiB (a runtime writes a few hundred bytes).
pub(crate) fn bounded_stdin() -> Result<Vec<u8>, HookError> {
    let mut buf = Vec::new();
    std::io::stdin()
        .take(1 << 20)
        .read_to_end(&mut buf)
        .map_err(|e| HookError::BadState {
            reason: e.to_string(),
        })?;
    Ok(buf)
}

/// Whether a cgroup v1 `devices.list` grants `rwm` on char device `major:minor` (an `a` or `c`
/// entry, `*` matching any number). An allow-all cgroup lists exactly `a *:* rwm`.
fn v1_list_allows(list: &str, major: u64, minor: u64) -> bool {
    list.lines().any(|l| {
        let mut f = l.split_whitespace();
        let (Some(t), Some(mm), Some(acc)) = (f.next(), f.next(), f.next()) else {
            return false;
        };
        let Some((ma, mi)) = mm.split_once(':') else {
            return false;
        };
        let num = |s: &str, v: u64| s == "*" || s.parse::<u64>() == Ok(v);
        (t == "a" || t == "c") && num(ma, major) && num(mi, minor) && "rwm".chars().all(|c| acc.contains(c))
    })
}

/// The rules the hook added to a cgroup v1 devices controller, to take back (`devices.deny`)
/// when a later step fails.
struct Allowed<'a> {
    ops: &'a dyn HostOps,
    deny: PathBuf,
    rules: Vec<String>,
}

impl Allowed<'_> {
    /// Write every rule to `devices.deny` (best effort: all are tried) and return `err`, or
    /// `err` wrapped with the rules still allowed when taking them back failed.
    fn revoke(self, err: HookError) -> HookError {
        let mut left = Vec::new();
        let mut first = None;
        for r in &self.rules {
            if let Err(e) = self.ops.write(&self.deny, r) {
                left.push(r.as_str());
                first.get_or_insert(e);
            }
        }
        match first {
            None => err,
            Some(source) => HookError::NotRevoked {
                error: Box::new(err),
                rules: left.join(", "),
                them: if left.len() == 1 { "it" } else { "them" },
                path: self.ops.root().display(&self.deny),
                source,
            },
        }
    }
}

/// Run the hook for one OCI state document; the cgroup v1 rules are written through `ops`.
pub(crate) fn run(ops: &dyn HostOps, state: &[u8]) -> Result<Report, HookError> {
    let host = ops.root();
    let st: State = serde_json::from_slice(state).map_err(|e| HookError::BadState {
        reason: e.to_string(),
    })?;
    if st.oci_version.is_empty() || st.id.is_empty() {
        return Err(HookError::BadState {
            reason: "ociVersion and id must not be empty".into(),
        });
    }
    let bundle = PathBuf::from(&st.bundle);
    if !bundle.is_absolute() {
        return Err(HookError::BadState {
            reason: format!("bundle {:?} is not an absolute path", st.bundle),
        });
    }
    let cfg_path = bundle.join("config.json");
    let cfg_text = crate::host::read_bounded(&cfg_path, 16 << 20).map_err(|e| HookError::Bundle {
        path: PathBuf::from(&st.bundle),
        reason: format!("cannot read config.json: {e}"),
    })?;
    let config: serde_json::Value = serde_json::from_str(&cfg_text).map_err(|e| HookError::Bundle {
        path: PathBuf::from(&st.bundle),
        reason: format!("config.json is not JSON: {e}"),
    })?;
    let value = st
        .annotations
        .get(ANNOTATION)
        .cloned()
        .or_else(|| config["annotations"][ANNOTATION].as_str().map(str::to_string));
    let Some(value) = value else {
        return Ok(Report::default());
    };
    let reqs = parse_request(&value)?;
    let policy = match st.annotations.get(BACKEND_ANNOTATION).cloned().or_else(|| {
        config["annotations"][BACKEND_ANNOTATION]
            .as_str()
            .map(str::to_string)
    }) {
        None => Policy::Auto,
        Some(v) => v.parse().map_err(|_| HookError::BadBackend { value: v })?,
    };
    let pid = st.pid.filter(|p| *p > 0).ok_or_else(|| HookError::BadState {
        reason: "no pid: run gpupass as a createRuntime (or prestart) hook".into(),
    })?;
    let root_path = config["root"]["path"].as_str().ok_or_else(|| HookError::Bundle {
        path: PathBuf::from(&st.bundle),
        reason: "config.json has no root.path".into(),
    })?;
    let rootfs = if Path::new(root_path).is_absolute() {
        PathBuf::from(root_path)
    } else {
        bundle.join(root_path)
    };
    if !rootfs.is_dir() {
        return Err(HookError::Bundle {
            path: PathBuf::from(&st.bundle),
            reason: format!("root.path {} is not a directory", rootfs.display()),
        });
    }

    // 1. Everything is checked before anything changes.
    // Only the requested devices and groups are read: the hook runs on every container start.
    let addrs: Vec<PciAddress> = reqs
        .iter()
        .filter_map(|r| match r {
            Request::Device(a) => Some(*a),
            Request::Group(_) => None,
        })
        .collect();
    let groups: Vec<u32> = reqs
        .iter()
        .filter_map(|r| match r {
            Request::Group(g) => Some(*g),
            Request::Device(_) => None,
        })
        .collect();
    let inv = crate::inventory::scan_groups(host, &addrs, &groups).map_err(HookError::Inventory)?;
    let paths = plan(&inv, &reqs, policy)?;
    let nodes: Vec<Node> = paths
        .iter()
        .map(|p| host_node(host, p))
        .collect::<Result<_, _>>()?;
    let cg_path = host.proc_pid(pid).join("cgroup");
    let cg_text = crate::host::read_bounded(&cg_path, 64 << 10).map_err(|e| HookError::Read {
        path: host.display(&cg_path).into(),
        source: e,
    })?;
    let ns_path = host.proc_pid(pid).join("ns/mnt");
    let ns_file = std::fs::File::open(&ns_path).map_err(|e| HookError::Namespace {
        pid,
        reason: format!("{}: {e}", host.display(&ns_path)),
    })?;
    let mut report = Report::default();

    // 2. The devices cgroup. On v1 the rules written are taken back if a later step fails.
    let mut allowed: Option<Allowed> = None;
    let mut v2: Option<(bpf::Extended, String)> = None;
    match device_cgroup(&cg_text) {
        Some(DeviceCgroup::V1(rel)) => {
            let dir = host
                .cgroup_root()
                .join("devices")
                .join(rel.trim_start_matches('/'));
            let allow = dir.join("devices.allow");
            // Only rules the cgroup lacks are written, so that taking them back restores what
            // was there: a device the cgroup already allows is never denied afterwards. An
            // allow-all cgroup (`a *:* rwm`: no runtime restricts it, or the container shares
            // a cgroup with the host) gets no writes at all; its hidden deny exceptions are
            // the administrator's, and an allow would lift them.
            let list = crate::host::read_bounded(&dir.join("devices.list"), 1 << 20).ok();
            let mut rules: Vec<String> = Vec::new();
            for n in &nodes {
                let r = format!("c {}:{} rwm", n.major, n.minor);
                let present = list
                    .as_deref()
                    .is_some_and(|l| v1_list_allows(l, n.major, n.minor));
                if !present && !rules.contains(&r) {
                    rules.push(r);
                }
            }
            let mut done = Allowed {
                ops,
                deny: dir.join("devices.deny"),
                rules: Vec::new(),
            };
            for r in rules {
                if let Err(e) = done.ops.write(&allow, &r) {
                    return Err(done.revoke(HookError::Cgroup {
                        path: host.display(&allow).into(),
                        source: e,
                    }));
                }
                done.rules.push(r);
            }
            allowed = Some(done);
        }
        Some(DeviceCgroup::V2(rel)) => {
            let dir = v2_dir(host, &rel);
            let shown = host.display(&dir);
            let bpf_err = |reason: String| HookError::Bpf {
                cgroup: shown.clone().into(),
                reason,
            };
            if rel.split('/').any(|c| c == "..") {
                return Err(bpf_err(format!(
                    "{} names the cgroup path {rel:?}",
                    host.display(&cg_path)
                )));
            }
            let fd = std::fs::File::open(&dir).map_err(|e| bpf_err(format!("cannot open it: {e}")))?;
            let mut grants: Vec<bpf::Grant> = Vec::new();
            for n in &nodes {
                let g = bpf::Grant {
                    major: n.major as u32,
                    minor: n.minor as u32,
                    access: bpf::ACC_READ | bpf::ACC_WRITE | bpf::ACC_MKNOD,
                };
                if !grants.contains(&g) {
                    grants.push(g);
                }
            }
            let ext = bpf::grant(fd.into(), &grants).map_err(|e| bpf_err(e.to_string()))?;
            if ext.count() == 0 && ext.ancestors == 0 {
                // No device program decides for this cgroup: every device is allowed already.
            } else if ext.ancestors > 0 {
                report.notes.push(format!(
                    "cgroup v2: {} device program(s) attached to ancestors of {shown} also decide; \
gpupass extends only the container cgroup's own, so if an ancestor denies {} opening fails with EPERM",
                    ext.ancestors,
                    rules_text(&nodes)
                ));
            }
            v2 = Some((ext, shown));
        }
        None => {
            if !nodes.iter().all(|n| config_allows(&config, n)) {
                report.notes.push(format!(
                    "{} names no cgroup; the devices {} are allowed only if the runtime allows them",
                    host.display(&cg_path),
                    rules_text(&nodes)
                ));
            }
        }
    }

    // 3. The nodes, inside the container's mount namespace. A failure takes the cgroup rules
    // back; after entering the namespace that is best effort: the runtime has not pivoted into
    // the rootfs at createRuntime, so the host's cgroup paths still resolve there.
    let res = ns::enter_mount_ns(&ns_file)
        .map_err(|e| HookError::Namespace {
            pid,
            reason: e.to_string(),
        })
        .and_then(|()| ns::create_nodes(&rootfs, &nodes));
    match res {
        Ok(created) => {
            report.created = created;
            Ok(report)
        }
        Err(e) => Err(match (allowed, v2) {
            (Some(a), _) => a.revoke(e),
            (None, Some((ext, shown))) => match ext.restore() {
                Ok(()) => e,
                Err((ids, source)) => HookError::NotRevoked {
                    error: Box::new(e),
                    rules: rules_text(&nodes),
                    them: if nodes.len() == 1 { "it" } else { "them" },
                    path: format!("{shown} (gpupass's device program(s) {ids:?} stay attached)"),
                    source,
                },
            },
            (None, None) => e,
        }),
    }
}

/// `c 240:40 rwm (/dev/vfio/40), ...`
fn rules_text(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| format!("c {}:{} rwm ({})", n.major, n.minor, n.path))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse() {
        assert_eq!(
            parse_request("0000:17:00.0, 42,17:00.0").unwrap(),
            [Request::Device("17:00.0".parse().unwrap()), Request::Group(42)]
        );
        for bad in ["", "x", "0000:17:00.0,", "99999999999", "../1"] {
            assert!(parse_request(bad).is_err(), "{bad}");
        }
    }

    /// The partial scan the hook uses agrees with the full inventory on what it reads.
    #[test]
    fn partial_scan_matches_the_full_one() {
        let host = HostRoot::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/hosts/vfio-numa"
        ));
        let full = crate::inventory::scan(&host).unwrap();
        let part = crate::inventory::scan_groups(&host, &["17:00.0".parse().unwrap()], &[42, 999]).unwrap();
        let nums: Vec<u32> = part.groups.iter().map(|g| g.number).collect();
        assert_eq!(nums, [40, 42]);
        for g in &part.groups {
            assert_eq!(Some(g), full.group(g.number));
        }
        assert_eq!(part.devices.len(), 3);
        for d in &part.devices {
            // The partial scan reads devices light: the full device minus what it leaves out.
            let mut f = full.device(&d.address).cloned().unwrap();
            f.revision = None;
            f.numa_node = None;
            f.local_cpulist = None;
            f.bars.clear();
            f.rom = None;
            f.reset_methods = None;
            f.sriov = None;
            f.mdev_types.clear();
            f.vgpu_types.clear();
            f.current_vgpu_type = None;
            f.nvidia = None;
            assert_eq!(d, &f);
        }
        let reqs = parse_request("0000:17:00.0,42").unwrap();
        assert_eq!(
            plan(&part, &reqs, Policy::Auto).unwrap(),
            plan(&full, &reqs, Policy::Auto).unwrap()
        );
        // One backend's node set per request, never both.
        for policy in [Policy::Legacy, Policy::Iommufd, Policy::Auto] {
            let nodes = plan(&full, &reqs, policy).unwrap();
            let b = backend::check_one_backend(nodes.iter().map(String::as_str)).unwrap();
            let want = if policy == Policy::Legacy {
                Backend::Legacy
            } else {
                Backend::Iommufd
            };
            assert_eq!(b, Some(want), "{policy}: {nodes:?}");
        }
    }

    #[test]
    fn v1_device_lists() {
        let runc = "c 1:3 rwm\nc 1:5 rwm\nc 136:* rwm\nc *:* m\nb *:* m\nc 10:200 rwm\n";
        assert!(v1_list_allows(runc, 136, 4));
        assert!(v1_list_allows(runc, 10, 200));
        assert!(!v1_list_allows(runc, 10, 196), "c *:* m grants mknod only");
        assert!(!v1_list_allows(runc, 240, 40));
        assert!(v1_list_allows("a *:* rwm\n", 240, 40));
        assert!(!v1_list_allows("c 240:40 rw\n", 240, 40), "rwm needs all three");
        assert!(!v1_list_allows("", 10, 196));
        assert!(!v1_list_allows("garbage\nc x:y rwm\n", 10, 196));
    }

    #[test]
    fn cgroup_lines() {
        let v1 = "9:name=systemd:/\n5:devices:/user.slice/abc\n0::/\n";
        assert_eq!(
            device_cgroup(v1),
            Some(DeviceCgroup::V1("/user.slice/abc".into()))
        );
        assert_eq!(
            device_cgroup("0::/system.slice/x\n"),
            Some(DeviceCgroup::V2("/system.slice/x".into()))
        );
        assert_eq!(device_cgroup("garbage"), None);
    }

    #[test]
    fn config_device_rules() {
        let n = Node {
            path: "/dev/vfio/3".into(),
            major: 240,
            minor: 3,
            mode: 0o600,
            uid: 0,
            gid: 0,
        };
        let c = serde_json::json!({"linux": {"resources": {"devices": [
            {"allow": false, "access": "rwm"},
            {"allow": true, "type": "c", "major": 240, "access": "rwm"}]}}});
        assert!(config_allows(&c, &n));
        let c = serde_json::json!({"linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}});
        assert!(!config_allows(&c, &n));
    }
}
