//! In-use detection and the other host facts a bind plan needs beyond the inventory.
//!
//! Kernel facts:
//! - `proc/self/mountinfo` field 3 is the `major:minor` of the mounted block device;
//!   `sys/dev/block/<major:minor>` links into the device tree, so a partition of an NVMe disk
//!   resolves to a path *under* the NVMe controller's PCI function. Device-mapper and md
//!   devices list what they sit on in `sys/class/block/<dev>/slaves/`.
//! - `sys/class/net/<if>/device` and `sys/class/drm/{cardN,renderDN}/device` link to the PCI
//!   function; an interface is up when `operstate` is `up` or bit 0 (IFF_UP) of `flags` is set.
//! - `proc/<pid>/fd/*` are links whose text is the opened path (`/dev/dri/renderD128`,
//!   `/dev/vfio/12`), readable for other users' processes only by root.
//! - `sys/class/graphics/fbN/device` links to the GPU a framebuffer lives on;
//!   `sys/class/vtconsole/vtconN/{name,bind}` say whether the framebuffer console ("frame
//!   buffer device") is bound.
//! - `lib/modules/<release>/modules.alias` lines `alias vfio_pci:v...d...sv*sd*bc*sc*i* mod`
//!   name VFIO variant drivers; the device's `modalias` prefixed with `vfio_` is matched against
//!   them and the pattern with the fewest wildcards wins.

use crate::host::{dir_names, link_name, read_attr, read_bounded, HostRoot};
use crate::model::{Inventory, PciAddress};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

/// Something on the host that uses a PCI function right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Use {
    Mount {
        block: String,
        mountpoint: String,
        fstype: String,
    },
    Swap {
        block: String,
    },
    NetUp {
        iface: String,
    },
    DrmOpen {
        node: String,
        pid: u32,
        comm: String,
    },
    /// `/dev/nvidia<minor>` of a GPU on NVIDIA's driver held open (a CUDA or graphics process).
    NvidiaOpen {
        node: String,
        pid: u32,
        comm: String,
    },
    /// A framebuffer; `console` names the bound framebuffer vtconsole, if any.
    Framebuffer {
        fb: String,
        console: Option<String>,
    },
}

/// The facts the planner needs, read once.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostFacts {
    pub uses: BTreeMap<PciAddress, Vec<Use>>,
    /// Names under `sys/bus/pci/drivers`.
    pub loaded_drivers: BTreeSet<String>,
    /// Driver name -> module name (`drivers/<d>/module` link), where known.
    pub driver_modules: BTreeMap<String, String>,
    /// Best VFIO variant driver per device, from modules.alias.
    pub variants: BTreeMap<PciAddress, String>,
    /// Group -> processes holding `/dev/vfio/<group>` open.
    pub vfio_open: BTreeMap<u32, Vec<(u32, String)>>,
    /// What could not be inspected (processes not readable...).
    pub warnings: Vec<String>,
}

impl HostFacts {
    pub(crate) fn uses_of(&self, a: &PciAddress) -> &[Use] {
        self.uses.get(a).map(Vec::as_slice).unwrap_or(&[])
    }
}

/// Glob match with `*` (any run) and `?` (one byte), as modules.alias uses.
pub fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0usize, 0usize);
    let (mut star, mut mark) = (None::<usize>, 0usize);
    while i < s.len() {
        if p < pat.len() && (pat[p] == b'?' || pat[p] == s[i]) {
            p += 1;
            i += 1;
        } else if p < pat.len() && pat[p] == b'*' {
            star = Some(p);
            mark = i;
            p += 1;
        } else if let Some(sp) = star {
            p = sp + 1;
            mark += 1;
            i = mark;
        } else {
            return false;
        }
    }
    while p < pat.len() && pat[p] == b'*' {
        p += 1;
    }
    p == pat.len()
}

/// `(pattern, module)` of every `alias vfio_pci:...` line. A distribution's modules.alias has
/// tens of thousands of lines and a handful of `vfio_pci:` ones: they are found with a
/// substring search rather than by splitting every line.
pub fn parse_vfio_aliases(text: &str) -> Vec<(String, String)> {
    const KEY: &str = "alias vfio_pci:";
    text.match_indices(KEY)
        .filter(|(i, _)| *i == 0 || text.as_bytes()[i - 1] == b'\n')
        .filter_map(|(i, _)| {
            let line = text[i..].split('\n').next()?;
            let mut f = line.split_whitespace();
            f.next()?;
            let pat = f.next()?;
            let module = f.next()?;
            Some((pat.to_string(), module.to_string()))
        })
        .collect()
}

/// The variant driver for a modalias: the matching `vfio_pci:` alias with the fewest
/// wildcards (libvirt's rule); `None` when no variant claims the device.
pub fn best_variant(aliases: &[(String, String)], modalias: &str) -> Option<String> {
    let key = format!("vfio_{modalias}");
    aliases
        .iter()
        .filter(|(p, _)| glob_match(p.as_bytes(), key.as_bytes()))
        .min_by_key(|(p, _)| p.bytes().filter(|&b| b == b'*' || b == b'?').count())
        .map(|(_, m)| m.clone())
}

fn canon(p: &Path) -> Option<PathBuf> {
    fs::canonicalize(p).ok()
}

/// Where a sysfs link points, from its text alone: one `readlink`, joined lexically onto the
/// directory that holds the link. The kernel's class and block links (`sys/class/drm/card0 ->
/// ../../devices/pci0000:00/0000:00:04.0/drm/card0`, `sys/dev/block/259:1 -> ...`) sit in real
/// directories and spell out the whole device path below `sys/devices`, so this equals
/// `canonicalize` (which costs one `readlink` per path component) for them.
fn link_target(link: &Path) -> Option<PathBuf> {
    let text = fs::read_link(link).ok()?;
    let dir = link.parent()?;
    Some(crate::host::join_link(dir, &text))
}

/// Maps sysfs device paths to the PCI function whose directory is their nearest ancestor.
///
/// Functions are matched by the name of a path component (`0000:00:04.0`) below `sys/devices`,
/// so a class device costs one `readlink` of its class link. Paths that do not reach
/// `sys/devices` lexically fall back to canonical paths, built on first use.
struct FnIndex<'a> {
    host: &'a HostRoot,
    inv: &'a Inventory,
    addrs: std::collections::HashSet<PciAddress>,
    devices_dir: PathBuf,
    by_path: std::cell::OnceCell<HashMap<PathBuf, PciAddress>>,
}

impl<'a> FnIndex<'a> {
    fn new(host: &'a HostRoot, inv: &'a Inventory) -> Self {
        FnIndex {
            host,
            inv,
            addrs: inv.devices.iter().map(|d| d.address).collect(),
            devices_dir: host.sys().join("devices"),
            by_path: std::cell::OnceCell::new(),
        }
    }

    fn canonical_index(&self) -> &HashMap<PathBuf, PciAddress> {
        self.by_path.get_or_init(|| {
            let mut m = HashMap::new();
            for d in &self.inv.devices {
                if let Some(c) = canon(&self.host.pci_device(&d.address)) {
                    m.insert(c, d.address);
                }
            }
            m
        })
    }

    /// The nearest PCI function at or above `p`. `p` is either a lexical path under
    /// `sys/devices` (matched by component names) or a canonical path.
    fn owner(&self, p: &Path) -> Option<PciAddress> {
        if let Ok(rel) = p.strip_prefix(&self.devices_dir) {
            let comps: Vec<&std::ffi::OsStr> = rel.iter().collect();
            return comps.iter().rev().find_map(|c| {
                let a: PciAddress = c.to_str()?.parse().ok()?;
                self.addrs.contains(&a).then_some(a)
            });
        }
        let idx = self.canonical_index();
        let mut cur = Some(p);
        while let Some(c) = cur {
            if let Some(a) = idx.get(c) {
                return Some(*a);
            }
            cur = c.parent();
        }
        None
    }

    /// Owner of a class device (`sys/class/<class>/<name>`): from its class link when that
    /// reaches `sys/devices`, else from the canonical path of its `device` link.
    fn owner_of_class_entry(&self, entry: &Path) -> Option<PciAddress> {
        match link_target(entry) {
            Some(t) if t.starts_with(&self.devices_dir) => self.owner(&t),
            _ => canon(&entry.join("device")).and_then(|c| self.owner(&c)),
        }
    }
}

/// Block devices a mounted `sys/class/block/<name>`-style device stands on: itself and,
/// through `slaves/`, what device-mapper/md builds it from (depth-bounded).
fn block_closure(host: &HostRoot, dev_link: &Path, out: &mut Vec<PathBuf>, depth: u32) {
    let devices = host.sys().join("devices");
    let Some(c) = link_target(dev_link)
        .filter(|t| t.starts_with(&devices))
        .or_else(|| canon(dev_link))
    else {
        return;
    };
    if out.contains(&c) || depth > 8 {
        return;
    }
    out.push(c.clone());
    for s in dir_names(&c.join("slaves")).unwrap_or_default() {
        block_closure(host, &host.sys_class("block").join(s), out, depth + 1);
    }
}

/// Read every fact the planner needs.
pub(crate) fn gather(host: &HostRoot, inv: &Inventory) -> HostFacts {
    gather_for(host, inv, Need::ALL)
}

/// Which facts a caller needs: a bind looks for users of the functions (mounts, interfaces,
/// DRM nodes, framebuffers) and for variant drivers; an unbind, whose functions sit on
/// vfio-pci and have none of those, only for processes holding their VFIO groups open.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Need {
    pub uses: bool,
    pub vfio_open: bool,
    pub variants: bool,
}

impl Need {
    pub(crate) const ALL: Need = Need {
        uses: true,
        vfio_open: true,
        variants: true,
    };
    pub(crate) const BIND: Need = Need {
        uses: true,
        vfio_open: false,
        variants: true,
    };
    pub(crate) const UNBIND: Need = Need {
        uses: false,
        vfio_open: true,
        variants: false,
    };
}

/// Read the facts `need` names.
pub(crate) fn gather_for(host: &HostRoot, inv: &Inventory, need: Need) -> HostFacts {
    let mut f = HostFacts::default();
    let idx = FnIndex::new(host, inv);

    // Drivers loaded, and their modules.
    // Modules only of the drivers the plan can name (the functions' own, vfio-pci): a host has
    // dozens of PCI drivers loaded.
    let named: BTreeSet<&str> = inv
        .devices
        .iter()
        .filter_map(|d| d.driver.as_deref())
        .chain(["vfio-pci", "pci-stub"])
        .collect();
    for d in dir_names(&host.sys_bus_pci_drivers()).unwrap_or_default() {
        if named.contains(d.as_str()) {
            if let Ok(Some(m)) = link_name(&host.pci_driver(&d).join("module")) {
                f.driver_modules.insert(d.clone(), m);
            }
        }
        f.loaded_drivers.insert(d);
    }

    let add = |f: &mut HostFacts, a: PciAddress, u: Use| {
        let v = f.uses.entry(a).or_default();
        if !v.contains(&u) {
            v.push(u);
        }
    };
    if need.uses {
        host_uses(host, &idx, &mut f, &add);
    }

    // DRM nodes of the functions in view.
    let mut drm_nodes: BTreeMap<String, PciAddress> = BTreeMap::new();
    let drm_names = if need.uses {
        dir_names(&host.sys_class("drm")).unwrap_or_default()
    } else {
        Vec::new()
    };
    for node in drm_names {
        let is_node = node
            .strip_prefix("card")
            .or_else(|| node.strip_prefix("renderD"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !is_node {
            continue;
        }
        if let Some(a) = idx.owner_of_class_entry(&host.sys_class("drm").join(&node)) {
            drm_nodes.insert(node, a);
        }
    }

    // `/dev/nvidia<minor>` of the functions in view that are on NVIDIA's driver (the minor is
    // in `proc/driver/nvidia/gpus/<address>/information`).
    let mut nv_nodes: BTreeMap<String, PciAddress> = BTreeMap::new();
    if need.uses {
        for d in inv
            .devices
            .iter()
            .filter(|d| d.driver.as_deref() == Some("nvidia"))
        {
            // A full scan has the minor already; a light one (bind) reads it here.
            let minor = d.nvidia.as_ref().and_then(|n| n.minor).or_else(|| {
                let info = host
                    .nvidia_gpus_proc()
                    .join(d.address.to_string())
                    .join("information");
                let text = read_bounded(&info, 64 << 10).ok()?;
                crate::inventory::parse_nvidia_information(&text).minor
            });
            if let Some(m) = minor {
                nv_nodes.insert(format!("nvidia{m}"), d.address);
            }
        }
    }

    // Open file descriptors: those DRM and NVIDIA nodes, and VFIO group nodes.
    let devdir = format!("{}/", host.display(&host.dev()));
    let dri = format!("{}/", host.display(&host.dev().join("dri")));
    let vfio = format!("{}/", host.display(&host.dev_vfio()));
    let wanted = |t: &str| {
        t.strip_prefix(dri.as_str())
            .is_some_and(|n| drm_nodes.contains_key(n))
            || t.strip_prefix(devdir.as_str())
                .is_some_and(|n| nv_nodes.contains_key(n))
            || (need.vfio_open
                && t.strip_prefix(vfio.as_str())
                    .is_some_and(|g| g.parse::<u32>().is_ok()))
    };
    // The walk over every process is the dearest fact: skip it when there is nothing to find.
    let vfio_present = need.vfio_open && inv.groups.iter().any(|g| g.vfio_node_present);
    let (mut open, unreadable) = if drm_nodes.is_empty() && nv_nodes.is_empty() && !vfio_present {
        (Vec::new(), 0)
    } else {
        crate::host::open_files(host, &wanted)
    };
    open.sort_by(|a, b| a.target.cmp(&b.target));
    if unreadable > 0 {
        f.warnings.push(format!(
            "could not inspect the open files of {unreadable} processes (gpupass needs root for that)"
        ));
    }
    for o in open {
        if let Some(node) = o.target.strip_prefix(dri.as_str()) {
            if let Some(a) = drm_nodes.get(node) {
                add(
                    &mut f,
                    *a,
                    Use::DrmOpen {
                        node: node.to_string(),
                        pid: o.pid,
                        comm: o.comm,
                    },
                );
            }
        } else if let Some((node, a)) = o
            .target
            .strip_prefix(devdir.as_str())
            .and_then(|n| nv_nodes.get_key_value(n))
        {
            add(
                &mut f,
                *a,
                Use::NvidiaOpen {
                    node: node.clone(),
                    pid: o.pid,
                    comm: o.comm,
                },
            );
        } else if let Some(g) = o
            .target
            .strip_prefix(vfio.as_str())
            .and_then(|g| g.parse::<u32>().ok())
        {
            let v = f.vfio_open.entry(g).or_default();
            if !v.iter().any(|(p, _)| *p == o.pid) {
                v.push((o.pid, o.comm));
            }
        }
    }

    // Framebuffers of the functions in view, and whether the framebuffer console is bound
    // (read only when one of them has a framebuffer).
    let mut fbs: Vec<(String, PciAddress)> = Vec::new();
    let fb_names = if need.uses {
        dir_names(&host.sys_class("graphics")).unwrap_or_default()
    } else {
        Vec::new()
    };
    for fb in fb_names {
        // fbN only (`fbcon` is the console driver's own entry).
        if !fb
            .strip_prefix("fb")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        if let Some(a) = idx.owner_of_class_entry(&host.sys_class("graphics").join(&fb)) {
            fbs.push((fb, a));
        }
    }
    if !fbs.is_empty() {
        let fbcon = dir_names(&host.sys_class("vtconsole"))
            .unwrap_or_default()
            .into_iter()
            .find(|v| {
                let d = host.sys_class("vtconsole").join(v);
                read_attr(&d.join("name")).is_ok_and(|n| n.contains("frame buffer"))
                    && read_attr(&d.join("bind")).is_ok_and(|b| b.trim() == "1")
            });
        for (fb, a) in fbs {
            add(
                &mut f,
                a,
                Use::Framebuffer {
                    fb,
                    console: fbcon.clone(),
                },
            );
        }
    }

    // VFIO variant drivers.
    if let (true, Some(rel)) = (need.variants, &inv.kernel) {
        let p = host.modules_dir(rel).join("modules.alias");
        if let Ok(text) = read_bounded(&p, 64 << 20) {
            let aliases = parse_vfio_aliases(&text);
            if !aliases.is_empty() {
                for d in &inv.devices {
                    if let Some(m) = d.modalias.as_deref().and_then(|ma| best_variant(&aliases, ma)) {
                        // vfio_pci itself has no `vfio_pci:` aliases; anything else is a variant.
                        if m != "vfio_pci" {
                            f.variants.insert(d.address, m);
                        }
                    }
                }
            }
        }
    }
    f
}

/// A filesystem mounted at `mountpoint` (as the mount table escapes it) from the block device
/// `dev_link` (`sys/dev/block/M:m` or `sys/class/block/<name>`): a use of every function that
/// device, or what it is built from, sits under.
fn mount_on(
    host: &HostRoot,
    idx: &FnIndex,
    f: &mut HostFacts,
    add: &dyn Fn(&mut HostFacts, PciAddress, Use),
    dev_link: &Path,
    mountpoint: &str,
    fstype: &str,
) {
    let mut chain = Vec::new();
    block_closure(host, dev_link, &mut chain, 0);
    for c in chain {
        if let Some(a) = idx.owner(&c) {
            let block = c
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let u = Use::Mount {
                block,
                mountpoint: unescape_mount(mountpoint),
                fstype: fstype.to_string(),
            };
            add(f, a, u);
        }
    }
}

/// Mounted filesystems, swap and network interfaces that are up, on the functions in view.
fn host_uses(
    host: &HostRoot,
    idx: &FnIndex,
    f: &mut HostFacts,
    add: &dyn Fn(&mut HostFacts, PciAddress, Use),
) {
    let mounts_from_info = read_bounded(&host.proc_self_mountinfo(), 16 << 20).ok();
    if let Some(text) = &mounts_from_info {
        for line in text.lines() {
            let (pre, post) = match line.split_once(" - ") {
                Some(x) => x,
                None => continue,
            };
            let fields: Vec<&str> = pre.split_whitespace().collect();
            let post: Vec<&str> = post.split_whitespace().collect();
            if fields.len() < 5 {
                continue;
            }
            let majmin = fields[2];
            if majmin.starts_with("0:") {
                continue;
            }
            let fstype = post.first().unwrap_or(&"?");
            mount_on(host, idx, f, add, &host.sys_dev_block(majmin), fields[4], fstype);
        }
    } else if let Ok(text) = read_bounded(&host.proc_self_mounts(), 16 << 20) {
        for line in text.lines() {
            let fl: Vec<&str> = line.split_whitespace().collect();
            if fl.len() < 3 {
                continue;
            }
            let Some(name) = fl[0].strip_prefix("/dev/") else {
                continue;
            };
            if name.contains('/') {
                continue;
            }
            mount_on(
                host,
                idx,
                f,
                add,
                &host.sys_class("block").join(name),
                fl[1],
                fl[2],
            );
        }
    }
    if let Ok(text) = read_bounded(&host.proc_swaps(), 1 << 20) {
        for line in text.lines().skip(1) {
            let Some(name) = line
                .split_whitespace()
                .next()
                .and_then(|s| s.strip_prefix("/dev/"))
            else {
                continue;
            };
            if name.contains('/') {
                continue;
            }
            let mut chain = Vec::new();
            block_closure(host, &host.sys_class("block").join(name), &mut chain, 0);
            for c in chain {
                if let Some(a) = idx.owner(&c) {
                    add(
                        f,
                        a,
                        Use::Swap {
                            block: name.to_string(),
                        },
                    );
                }
            }
        }
    }

    // Network interfaces that are up.
    for ifc in dir_names(&host.sys_class("net")).unwrap_or_default() {
        let d = host.sys_class("net").join(&ifc);
        let Some(a) = idx.owner_of_class_entry(&d) else {
            continue;
        };
        let oper = read_attr(&d.join("operstate")).unwrap_or_default();
        let flags = read_attr(&d.join("flags"))
            .ok()
            .and_then(|s| crate::host::parse_hex(&s))
            .unwrap_or(0);
        if oper.trim() == "up" || flags & 1 != 0 {
            add(f, a, Use::NetUp { iface: ifc });
        }
    }
}

/// Mount points escape space, tab, newline and backslash as octal (`\040`).
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match(
            b"vfio_pci:v000010DEd00002342sv*sd*bc*sc*i*",
            b"vfio_pci:v000010DEd00002342sv000010DEsd000016C1bc03sc02i00"
        ));
        assert!(!glob_match(
            b"vfio_pci:v000010DEd00002342sv*",
            b"vfio_pci:v000010DEd00002330sv000010DE"
        ));
        assert!(glob_match(b"a?c*", b"abcdef"));
        assert!(glob_match(b"*", b""));
        assert!(!glob_match(b"a", b""));
    }

    #[test]
    fn fewest_wildcards_wins() {
        let t = "alias pci:v000010DEd*sv*sd*bc03sc*i* nvidia\n\
                 alias vfio_pci:v000010DEd*sv*sd*bc*sc*i* broad_vfio_pci\n\
                 alias vfio_pci:v000010DEd00002342sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci\n\
                 garbage line\n";
        let a = parse_vfio_aliases(t);
        assert_eq!(a.len(), 2);
        let m = "pci:v000010DEd00002342sv000010DEsd000016C1bc03sc02i00";
        assert_eq!(best_variant(&a, m).as_deref(), Some("nvgrace_gpu_vfio_pci"));
        let other = "pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00";
        assert_eq!(best_variant(&a, other).as_deref(), Some("broad_vfio_pci"));
        assert_eq!(best_variant(&a, "pci:v00008086d00001234sv0sd0bc03sc00i00"), None);
    }

    #[test]
    fn mount_escapes() {
        assert_eq!(unescape_mount("/mnt/my\\040disk"), "/mnt/my disk");
        assert_eq!(unescape_mount("/plain"), "/plain");
        assert_eq!(unescape_mount("/trail\\04"), "/trail\\04");
    }
}
