//! Binding conditions (KEP-5007) for gpupass's driver: a group that needs a driver switch (a
//! member not on a VFIO driver yet) is published with the binding condition [`READY`](super::slices::READY) and the
//! failure condition [`FAILED`](super::slices::FAILED) ([`mark`](super::slices::mark)), so the scheduler waits, after allocating it and
//! before binding the Pod, until the plugin has done the switch: the same journaled group bind
//! Prepare does ([`super::apply::prepare`], one plan owned by the claim, rolled back on a
//! failure), without the claim's files ([`Driver::bind_early`]). A failure (a member in use by
//! a host process, the lock held, a claim gpupass refuses) sets [`FAILED`](super::slices::FAILED) with a reason and
//! gpupass's message: the scheduler deallocates the claim and the Pod goes back to scheduling,
//! instead of being bound to a node whose Prepare cannot succeed.
//!
//! The checkpoint records the bind as a [`State::Bound`] entry (written before the bind, with
//! each member's driver before): Prepare takes it over (the group is on vfio-pci already, the
//! drivers before are those of the first attempt), Unprepare gives the functions back as
//! always, and a claim deallocated, deleted or moved before the kubelet prepared it is
//! unprepared by the plugin itself ([`Driver::release_early`]). Groups already on vfio-pci
//! (bound at boot, `gpupass persist`) carry no conditions: nothing is switched for them.

use super::apply;
use super::checkpoint::{Entry, State};
use super::claim::{ClaimDevice, ClaimRef};
use super::prepare::{Driver, PrepareError};
use crate::bind::BindError;
use crate::change::engine::current_driver;
use crate::change::ChangeError;
use crate::containers::kubelet::binding::{DeviceKey, Failure};
use crate::containers::kubelet::claims::Claim;
use crate::model::{is_vfio_driver, ErrorChain, Inventory, PciAddress};
use std::collections::BTreeMap;

/// The failure condition's reason for `e`: `InUse` (a member held by a host process: gpupass's
/// in-use refusal), `Refused` (another refusal of the bind planner), `Locked` (another gpupass
/// holds the lock), `HeldByClaim` (another claim holds the device, by the plugin's checkpoint
/// or the journal's holds: one owner per group), `ClaimRefused`
/// (the claim's checks), `BindFailed` (a write or check failed and was rolled back), `HostError`.
pub(crate) fn reason(e: &PrepareError) -> &'static str {
    match e {
        PrepareError::Claim(_) => "ClaimRefused",
        PrepareError::Held { .. } => "HeldByClaim",
        PrepareError::Apply { source, .. } => match source.as_ref() {
            apply::ApplyError::Bind(BindError::Refused(m)) => {
                if m.contains(" is open by pid ") || m.contains("backs ") || m.contains(" is up on it") {
                    "InUse"
                } else {
                    "Refused"
                }
            }
            apply::ApplyError::Held { .. } => "HeldByClaim",
            apply::ApplyError::Bind(BindError::Change(ChangeError::Locked { .. }))
            | apply::ApplyError::Change(ChangeError::Locked { .. }) => "Locked",
            _ => "BindFailed",
        },
        _ => "HostError",
    }
}

impl Driver<'_> {
    /// The bind before binding of `keys` (devices of `claim` that wait on [`READY`]), as a
    /// condition's outcome: the message of [`READY`], or [`FAILED`]'s reason and message.
    ///
    /// An `InUse` failure marks the devices busy ([`Driver::busy`]): they are published with
    /// the busy taint until no host process holds them, so the scheduler, which deallocates the
    /// claim on the failure condition, does not hand the Pod the same device again.
    pub(crate) fn bind_early(&mut self, claim: &Claim, keys: &[DeviceKey]) -> Result<String, Failure> {
        self.try_bind_early(claim, keys).map_err(|e| {
            let f = Failure {
                reason: reason(&e).to_string(),
                message: ErrorChain(&e).to_string(),
            };
            if f.reason == "InUse" {
                for k in keys {
                    self.busy.insert(k.device.clone(), f.message.clone());
                }
            }
            f
        })
    }

    /// The devices of `keys` an early bind switches for `claim` (PCI functions; an mdev waits
    /// for Prepare), from Prepare's own claim check against `inv`: what Prepare would refuse
    /// is refused before binding.
    fn early_devices(
        &self,
        claim: &Claim,
        keys: &[DeviceKey],
        inv: &Inventory,
        label: &str,
    ) -> Result<Vec<ClaimDevice>, PrepareError> {
        let checked = self.check_claim(claim, inv, label)?;
        Ok(checked
            .devices
            .into_iter()
            .filter(|d| d.mdev.is_none() && keys.iter().any(|k| k.device == d.device))
            .collect())
    }

    fn try_bind_early(&mut self, claim: &Claim, keys: &[DeviceKey]) -> Result<String, PrepareError> {
        let c = &claim.asked;
        let label = format!("{}/{} ({})", c.namespace, c.name, c.uid);
        let earlier: Option<Entry> = self
            .checkpoint
            .claims
            .get(&c.uid)
            .filter(|e| e.boot_id == self.boot_id)
            .cloned();
        if earlier.as_ref().is_some_and(|e| e.state == State::Completed) {
            return Ok(format!("claim {label} is prepared already"));
        }
        let inv = self.view()?;
        let devices = match self.early_devices(claim, keys, &inv, &label) {
            Ok(devices) => devices,
            Err(e) => {
                // Refused before anything changed: the view is still the host's, for the
                // next request (as Prepare keeps it).
                self.after = Some(inv);
                return Err(e);
            }
        };
        let members: Vec<PciAddress> = devices.iter().flat_map(|d| d.members.iter().copied()).collect();
        let groups: Vec<String> = devices
            .iter()
            .filter_map(|d| d.members.first())
            .filter_map(|a| inv.device(a).and_then(|x| x.iommu_group))
            .map(|g| g.to_string())
            .collect();
        let before = earlier
            .as_ref()
            .map(|e| e.drivers_before.clone())
            .unwrap_or_default();
        let drivers_before: BTreeMap<PciAddress, Option<String>> = members
            .iter()
            .map(|a| {
                let now = inv.device(a).and_then(|d| d.driver.clone());
                (*a, before.get(a).cloned().unwrap_or(now))
            })
            .collect();
        let host = self.ops.root().clone();
        if earlier.is_some()
            && members
                .iter()
                .all(|a| current_driver(&host, a).as_deref().is_some_and(is_vfio_driver))
        {
            // Nothing to change (each member's driver read now, not from the view): the view
            // is still the host's.
            self.after = Some(inv);
            return Ok(format!(
                "IOMMU group {} on vfio-pci for claim {label} already",
                groups.join(", ")
            ));
        }
        let previous = self.checkpoint.claims.get(&c.uid).cloned();
        // Written before the bind: a crash inside it leaves an entry that the start-up
        // clean-up (or this watcher's release) settles.
        self.checkpoint.claims.insert(
            c.uid.clone(),
            Entry {
                claim: c.clone(),
                boot_id: self.boot_id.clone(),
                state: earlier.as_ref().map_or(State::Bound, |e| e.state),
                devices,
                drivers_before,
                prepared: None,
            },
        );
        self.save()?;
        let mut no_files = |_: &crate::host::HostRoot,
                            _: &Inventory|
         -> Result<Vec<apply::File>, apply::FilesError> { Ok(Vec::new()) };
        let r = apply::prepare(
            self.ops,
            self.lock_wait,
            &apply::Owner::claim(&c.uid, &label),
            &format!("files of claim {label}"),
            &members,
            &[],
            &mut no_files,
        );
        match r {
            Ok(done) => {
                self.settle_before(&c.uid, &before, &done.moved);
                self.after = done.view;
                self.save()?;
                let moved: Vec<String> = done.moved.keys().map(|a| a.to_string()).collect();
                Ok(format!(
                    "IOMMU group {} on vfio-pci for claim {label}{}",
                    groups.join(", "),
                    if moved.is_empty() {
                        String::new()
                    } else {
                        format!(" (moved {})", moved.join(" "))
                    }
                ))
            }
            Err(e) => {
                if e.changed_nothing() {
                    match previous {
                        Some(p) => self.checkpoint.claims.insert(c.uid.clone(), p),
                        None => self.checkpoint.claims.remove(&c.uid),
                    };
                    self.save()?;
                }
                Err(PrepareError::Apply {
                    claim: label,
                    what: "the bind before binding".into(),
                    source: Box::new(e),
                })
            }
        }
    }

    /// Unprepare every claim bound before binding ([`State::Bound`]) that `gone` names and the
    /// kubelet never prepared: its functions back on the drivers they had. Returns what was
    /// done, one line each.
    pub(crate) fn release_early(&mut self, gone: &dyn Fn(&ClaimRef) -> bool) -> Vec<String> {
        let uids: Vec<(String, String)> = self
            .checkpoint
            .claims
            .values()
            .filter(|e| e.state == State::Bound && gone(&e.claim))
            .map(|e| {
                (
                    e.claim.uid.clone(),
                    format!("{}/{} ({})", e.claim.namespace, e.claim.name, e.claim.uid),
                )
            })
            .collect();
        uids.into_iter()
            .map(|(uid, label)| match self.unprepare(&uid) {
                Ok(()) => format!(
                    "claim {label} was bound before binding and is no longer allocated here: its group is given back"
                ),
                Err(e) => format!(
                    "claim {label} was bound before binding and is no longer allocated here: giving its group back failed: {}",
                    ErrorChain(&e)
                ),
            })
            .collect()
    }
}
