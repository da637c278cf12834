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
}

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
        })
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
            apply(
                Change::Bind(&to_bind),
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
            if let Err(e) = crate::output::cdi::refresh(self.ops.root()) {
                tracing::warn!(
                    "the CDI spec could not be refreshed: {}",
                    crate::model::ErrorChain(&e)
                );
            }
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
                if let Err(err) = crate::output::cdi::refresh(self.ops.root()) {
                    tracing::warn!(
                        "the CDI spec could not be refreshed: {}",
                        crate::model::ErrorChain(&err)
                    );
                }
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
