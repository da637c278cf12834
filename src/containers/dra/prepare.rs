//! Prepare, Unprepare, the start-up cleanup and device health: the checks of [`claim`], the
//! checkpoint of [`checkpoint`] and the host changes of [`apply`], in order. One [`Engine`]
//! per plugin, used from one thread at a time (the gRPC server hands it its calls one by one,
//! so two claims for devices of one group are serialized; across processes the bind engine's
//! lock serializes them).

use super::apply::{self, Change};
use super::checkpoint::{self, Checkpoint, Entry, State};
use super::claim::{self, ClaimRef, Identity, PreparedDevice};
use super::slices;
use super::source::ClaimSource;
use crate::host::ops::HostOps;
use crate::inventory::backend::Policy;
use crate::model::{is_vfio_driver, Inventory, PciAddress};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Why Prepare or Unprepare failed: the message kubelet puts in the Pod's events.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Source(#[from] super::source::SourceError),
    #[error(transparent)]
    Claim(Box<claim::ClaimError>),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
    #[error("claim {claim}: device {device} is prepared for claim {holder}; one IOMMU group has one user (the scheduler should not have allocated it twice: is another DRA driver or a stale checkpoint involved?)")]
    Held {
        claim: String,
        device: String,
        holder: String,
    },
    #[error("claim {claim}: {what}")]
    Apply {
        claim: String,
        what: String,
        #[source]
        source: Box<apply::ApplyError>,
    },
}

impl From<claim::ClaimError> for PrepareError {
    fn from(e: claim::ClaimError) -> Self {
        PrepareError::Claim(Box::new(e))
    }
}

/// The plugin's state.
pub struct Engine<'a> {
    pub ops: &'a dyn HostOps,
    pub source: Box<dyn ClaimSource + 'a>,
    pub me: Identity,
    pub default: Policy,
    pub boot_id: String,
    pub checkpoint_path: PathBuf,
    checkpoint: Checkpoint,
    /// Every device name health was ever reported for (a device that vanishes stays on the
    /// health stream as unhealthy).
    known: BTreeSet<String>,
    /// Run after a change of drivers (the command layer refreshes the host's CDI spec:
    /// `containers` does not reach up into `cli`).
    after_change: Option<AfterChange>,
}

/// What the command layer runs after Prepare or Unprepare moved functions between drivers.
pub type AfterChange = fn(&dyn HostOps) -> Result<(), String>;

/// One device's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub device: String,
    pub healthy: bool,
    pub message: String,
}

impl<'a> Engine<'a> {
    pub fn new(
        ops: &'a dyn HostOps,
        source: Box<dyn ClaimSource + 'a>,
        me: Identity,
        default: Policy,
        boot_id: String,
    ) -> Result<Self, PrepareError> {
        let checkpoint_path = checkpoint::path(ops.root(), &me.driver);
        let checkpoint = checkpoint::load(&checkpoint_path)?;
        Ok(Engine {
            ops,
            source,
            me,
            default,
            boot_id,
            checkpoint_path,
            checkpoint,
            known: BTreeSet::new(),
            after_change: None,
        })
    }

    /// Run `f` after each Prepare or Unprepare that moved functions between drivers.
    pub fn with_after_change(mut self, f: AfterChange) -> Self {
        self.after_change = Some(f);
        self
    }

    fn changed(&self) {
        if let Some(f) = self.after_change {
            if let Err(e) = f(self.ops) {
                tracing::warn!("the CDI spec could not be refreshed: {e}");
            }
        }
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    fn save(&self) -> Result<(), PrepareError> {
        Ok(checkpoint::save(&self.checkpoint_path, &self.checkpoint)?)
    }

    fn scan(&self) -> Result<Inventory, PrepareError> {
        Ok(crate::inventory::scan(self.ops.root())?)
    }

    /// NodePrepareResources for one claim. Idempotent: a claim prepared in this boot returns
    /// what it returned before without touching the host; one whose Prepare was interrupted
    /// is prepared again (the bind is idempotent) keeping the drivers of the first attempt.
    pub fn prepare(&mut self, c: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        if let Some(e) = self.checkpoint.claims.get(&c.uid) {
            if e.boot_id == self.boot_id && e.state == State::Completed {
                if let Some(p) = &e.prepared {
                    return Ok(p.devices.clone());
                }
            }
        }
        let label = format!("{}/{} ({})", c.namespace, c.name, c.uid);
        let obj = self.source.get(&c.namespace, &c.name)?;
        let inv = self.scan()?;
        let offered = slices::publishable(&inv);
        let checked = claim::check(c, &obj, &self.me, &offered, self.default)?;
        for d in &checked.devices {
            if let Some(h) = self.checkpoint.holder(&d.device, &c.uid, &self.boot_id) {
                return Err(PrepareError::Held {
                    claim: label,
                    device: d.device.clone(),
                    holder: format!("{}/{} ({})", h.claim.namespace, h.claim.name, h.claim.uid),
                });
            }
        }
        let members: Vec<PciAddress> = checked
            .devices
            .iter()
            .flat_map(|d| d.members.iter().copied())
            .collect();
        let earlier = self
            .checkpoint
            .claims
            .get(&c.uid)
            .filter(|e| e.boot_id == self.boot_id)
            .map(|e| e.drivers_before.clone())
            .unwrap_or_default();
        let drivers_before: BTreeMap<PciAddress, Option<String>> = members
            .iter()
            .map(|a| {
                let now = inv.device(a).and_then(|d| d.driver.clone());
                (*a, earlier.get(a).cloned().unwrap_or(now))
            })
            .collect();
        self.checkpoint.claims.insert(
            c.uid.clone(),
            Entry {
                claim: c.clone(),
                boot_id: self.boot_id.clone(),
                state: State::Started,
                devices: checked.devices.clone(),
                drivers_before,
                prepared: None,
            },
        );
        self.save()?;
        let apply = |change: Change<'_>, what: String| {
            apply::apply(self.ops, &change).map_err(|e| PrepareError::Apply {
                claim: label.clone(),
                what,
                source: Box::new(e),
            })
        };
        let to_bind: Vec<PciAddress> = members
            .iter()
            .copied()
            .filter(|a| {
                !inv.device(a)
                    .and_then(|d| d.driver.as_deref())
                    .is_some_and(is_vfio_driver)
            })
            .collect();
        if !to_bind.is_empty() {
            // Every member is named, those already on VFIO too: the bind planner refuses a
            // group member of another slot that was not named.
            apply(
                Change::Bind(&members),
                "binding its IOMMU group(s) to vfio-pci".into(),
            )?;
        }
        let after = self.scan()?;
        let backend = claim::choose_backend(&after, &checked)?;
        let prepared = claim::result(&after, &self.me.driver, &checked, backend);
        for f in &prepared.files {
            apply(
                Change::Write {
                    path: &f.path,
                    contents: &f.contents,
                },
                format!("writing {}", f.path),
            )?;
        }
        let devices = prepared.devices.clone();
        if let Some(e) = self.checkpoint.claims.get_mut(&c.uid) {
            e.state = State::Completed;
            e.prepared = Some(prepared);
        }
        self.save()?;
        if !to_bind.is_empty() {
            self.changed();
        }
        Ok(devices)
    }

    /// NodeUnprepareResources for one claim: its files removed, the functions it moved given
    /// back (only in the boot that moved them), its entry dropped. A claim the plugin does not
    /// know is done already.
    pub fn unprepare(&mut self, uid: &str) -> Result<(), PrepareError> {
        let Some(e) = self.checkpoint.claims.get(uid).cloned() else {
            return Ok(());
        };
        let label = format!("{}/{} ({})", e.claim.namespace, e.claim.name, e.claim.uid);
        let apply = |change: Change<'_>, what: String| {
            apply::apply(self.ops, &change).map_err(|err| PrepareError::Apply {
                claim: label.clone(),
                what,
                source: Box::new(err),
            })
        };
        let stop = super::plugin_dir_logical(&self.me.driver);
        for path in files_of(&self.me.driver, &e) {
            apply(
                Change::Remove {
                    path: &path,
                    stop_at: Some(&stop),
                },
                format!("removing {path}"),
            )?;
        }
        if e.boot_id == self.boot_id {
            let moved = e.moved();
            if !moved.is_empty() {
                apply(
                    Change::Restore(&moved),
                    "giving its functions back to their drivers".into(),
                )?;
                self.changed();
            }
        }
        self.checkpoint.claims.remove(uid);
        self.save()
    }

    /// At start: claims of an earlier boot lose their files (their binds went with that
    /// kernel), and claims the API server no longer has (deleted while the plugin was down)
    /// are unprepared. Returns what was cleaned, one line each.
    pub fn cleanup_at_start(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let entries: Vec<Entry> = self.checkpoint.claims.values().cloned().collect();
        for e in entries {
            let gone = if e.boot_id != self.boot_id {
                Some("prepared before the node rebooted".to_string())
            } else {
                match self.source.get(&e.claim.namespace, &e.claim.name) {
                    Err(super::source::SourceError::NotFound { .. }) => Some("deleted".to_string()),
                    Ok(obj) if obj.metadata.uid.as_deref() != Some(e.claim.uid.as_str()) => {
                        Some("deleted and recreated".to_string())
                    }
                    _ => None,
                }
            };
            if let Some(why) = gone {
                let label = format!("{}/{} ({})", e.claim.namespace, e.claim.name, e.claim.uid);
                match self.unprepare(&e.claim.uid) {
                    Ok(()) => out.push(format!("claim {label} {why}: unprepared")),
                    Err(err) => out.push(format!(
                        "claim {label} {why}: unprepare failed: {}",
                        crate::model::ErrorChain(&err)
                    )),
                }
            }
        }
        out
    }

    /// Every device's health now: published devices, and devices prepared in this boot
    /// (whose members must still be on a VFIO driver in a viable group); a device reported
    /// before and gone now is unhealthy.
    pub fn health(&mut self, inv: &Inventory) -> Vec<Health> {
        let prepared: Vec<&Entry> = self
            .checkpoint
            .claims
            .values()
            .filter(|e| e.boot_id == self.boot_id && e.state == State::Completed)
            .collect();
        let h = health(inv, &prepared, &self.known);
        self.known.extend(h.iter().map(|d| d.device.clone()));
        h
    }
}

/// The files a claim may have written (from its result, or from its devices when Prepare
/// stopped before the result).
fn files_of(driver: &str, e: &Entry) -> Vec<String> {
    if let Some(p) = &e.prepared {
        return p.files.iter().map(|f| f.path.clone()).collect();
    }
    let mut v = vec![claim::claim_spec_path(driver, &e.claim.uid)];
    let mut reqs: Vec<&str> = e
        .devices
        .iter()
        .map(|d| d.request.split_once('/').map_or(d.request.as_str(), |(b, _)| b))
        .collect();
    reqs.sort_unstable();
    reqs.dedup();
    for r in reqs {
        v.push(claim::metadata_host_path(driver, &e.claim, r));
        v.push(claim::metadata_spec_path(driver, &e.claim.uid, r));
    }
    v
}

/// Health, pure: see [`Engine::health`].
pub fn health(inv: &Inventory, prepared: &[&Entry], known: &BTreeSet<String>) -> Vec<Health> {
    let mut out: BTreeMap<String, Health> = BTreeMap::new();
    for p in slices::publishable(inv) {
        out.insert(
            p.name.clone(),
            Health {
                device: p.name,
                healthy: true,
                message: String::new(),
            },
        );
    }
    for e in prepared {
        for d in &e.devices {
            let mut problem = None;
            for a in &d.members {
                let Some(f) = inv.device(a) else {
                    problem = Some(format!("{a} is gone"));
                    break;
                };
                if let Err(r) = inv.vfio_group(f) {
                    let who = r.blocker_list();
                    problem = Some(if who.is_empty() {
                        format!("{a}: {r}")
                    } else {
                        format!("{a}: {r}: {who} left VFIO behind gpupass's back")
                    });
                    break;
                }
            }
            out.insert(
                d.device.clone(),
                Health {
                    device: d.device.clone(),
                    healthy: problem.is_none(),
                    message: problem.unwrap_or_default(),
                },
            );
        }
    }
    for k in known {
        out.entry(k.clone()).or_insert_with(|| Health {
            device: k.clone(),
            healthy: false,
            message: "no longer on this node (removed, or its IOMMU group changed)".into(),
        });
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostRoot;
    use crate::testkit::hostgen::{DevSpec, HostBuilder};
    use crate::testkit::FakeHost;

    fn driver_of(root: &std::path::Path, a: &str) -> Option<String> {
        std::fs::read_link(root.join("sys/bus/pci/devices").join(a).join("driver"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
    }

    /// A group of two GPUs in different slots, one of them bound to vfio-pci before gpupass
    /// (a boot-time bind): Prepare binds the other, Unprepare gives back only that one.
    #[test]
    fn a_member_on_vfio_before_stays_there_and_only_moved_functions_go_back() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("host");
        let mut h = HostBuilder::new(&root).unwrap();
        h.kernel(
            "6.1.0-27-amd64",
            "ro intel_iommu=on",
            &["vfio", "vfio_pci", "nvidia"],
        )
        .unwrap();
        h.add(
            &DevSpec::new("03:00.0", 0x10de, 0x2684, 0x030000)
                .group(7)
                .driver("nvidia"),
        )
        .unwrap();
        h.add(
            &DevSpec::new("04:00.0", 0x10de, 0x2684, 0x030000)
                .group(7)
                .driver("vfio-pci"),
        )
        .unwrap();
        h.file("dev/vfio/vfio", "").unwrap();
        let claims = t.path().join("claims");
        std::fs::create_dir_all(claims.join("default")).unwrap();
        let c = serde_json::json!({
            "metadata": {"name": "gpu", "namespace": "default", "uid": "u1"},
            "status": {"allocation": {
                "devices": {"results": [{"request": "vfio", "driver": "vfio.gpupass.dev", "pool": "node-a", "device": "pci-0000-03-00-0"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}
            }}
        });
        std::fs::write(claims.join("default/gpu.json"), c.to_string()).unwrap();
        let ops = FakeHost::new(HostRoot::new(&root));
        let me = Identity {
            driver: "vfio.gpupass.dev".into(),
            node: "node-a".into(),
            pool: "node-a".into(),
        };
        let mut e = Engine::new(
            &ops,
            Box::new(super::super::source::Dir { dir: claims }),
            me,
            Policy::Auto,
            "b1".into(),
        )
        .unwrap();
        let r = ClaimRef {
            namespace: "default".into(),
            uid: "u1".into(),
            name: "gpu".into(),
        };
        let devs = e.prepare(&r).unwrap();
        assert_eq!(devs[0].device, "pci-0000-03-00-0");
        assert_eq!(driver_of(&root, "0000:03:00.0").as_deref(), Some("vfio-pci"));
        assert_eq!(driver_of(&root, "0000:04:00.0").as_deref(), Some("vfio-pci"));
        let entry = &e.checkpoint().claims["u1"];
        assert_eq!(entry.state, State::Completed);
        assert_eq!(entry.moved(), ["0000:03:00.0".parse::<PciAddress>().unwrap()]);
        e.unprepare("u1").unwrap();
        assert_eq!(driver_of(&root, "0000:03:00.0").as_deref(), Some("nvidia"));
        assert_eq!(
            driver_of(&root, "0000:04:00.0").as_deref(),
            Some("vfio-pci"),
            "a boot-time bind stays"
        );

        // A claim deleted while the plugin was down: unprepared when the plugin starts.
        e.prepare(&r).unwrap();
        let claim_file = t.path().join("claims/default/gpu.json");
        let text = std::fs::read_to_string(&claim_file).unwrap();
        std::fs::remove_file(&claim_file).unwrap();
        let source = || {
            Box::new(super::super::source::Dir {
                dir: t.path().join("claims"),
            })
        };
        let mut restarted = Engine::new(&ops, source(), e.me.clone(), Policy::Auto, "b1".into()).unwrap();
        assert_eq!(
            restarted.cleanup_at_start(),
            ["claim default/gpu (u1) deleted: unprepared"]
        );
        assert_eq!(driver_of(&root, "0000:03:00.0").as_deref(), Some("nvidia"));
        assert!(restarted.checkpoint().claims.is_empty());

        // A claim of an earlier boot: at start its files go, its functions are not touched.
        std::fs::write(&claim_file, text).unwrap();
        restarted.prepare(&r).unwrap();
        let mut after_reboot = Engine::new(&ops, source(), e.me.clone(), Policy::Auto, "b2".into()).unwrap();
        let lines = after_reboot.cleanup_at_start();
        assert_eq!(
            lines,
            ["claim default/gpu (u1) prepared before the node rebooted: unprepared"]
        );
        assert!(after_reboot.checkpoint().claims.is_empty());
        assert!(!root.join("var/run/cdi/vfio.gpupass.dev_claim_u1.json").exists());
        assert_eq!(
            driver_of(&root, "0000:03:00.0").as_deref(),
            Some("vfio-pci"),
            "the fake host did not reboot; a real reboot would have reset it"
        );
    }
}
