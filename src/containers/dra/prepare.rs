//! gpupass's DRA driver ([`Driver`], what the kubelet-plugin kit serves:
//! [`crate::containers::kubelet::plugin::DraDriver`]): Prepare, Unprepare, the start-up cleanup
//! and device health, from the checks of [`claim`], the checkpoint of [`checkpoint`] and the
//! host changes of [`apply`] (one plan of the change engine per Prepare and per Unprepare,
//! owned by the claim), in order. One [`Driver`] per plugin, used from one thread at a time
//! (the kit hands it its calls one by one, so two claims for devices of one group are
//! serialized; across processes the change engine's lock serializes them, waited for at most
//! [`Driver::lock_wait`] and never past the kubelet's deadline). The kit reads each claim from
//! the API server and checks its UID before the driver is handed it.

use super::apply;
use super::checkpoint::{self, Checkpoint, Entry, State};
use super::claim::{self, ClaimRef, Identity, Prepared, PreparedDevice};
use super::signals::{self, Problem};
use super::slices;
use crate::containers::kubelet::claims::{Claim, ClaimSource, SourceError};
use crate::containers::kubelet::plugin::{DraDriver, Resources};
use crate::containers::kubelet::pool::Pool;
use crate::host::ops::HostOps;
use crate::inventory::backend::Policy;
use crate::model::{Inventory, PciAddress};
use k8s_openapi::api::resource::v1::DeviceTaint;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long Prepare and Unprepare wait for another gpupass holding the lock, at most: a few
/// seconds, so a kubelet call fails and is retried instead of hanging (the commands wait
/// `GPUPASS_LOCK_TIMEOUT`, 30 s).
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(3);

/// Kept from the kubelet's deadline for the work after the lock (the scans, the writes, the
/// reply).
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(500);

/// Why Prepare or Unprepare failed: the message kubelet puts in the Pod's events.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("cannot read the boot id ({}); the plugin needs it to tell a reboot from a restart", .path.display())]
    BootId {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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
    #[error("claim {claim}: {problem}")]
    Mdev { claim: String, problem: String },
    #[error("claim {claim}: {what} failed")]
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

/// gpupass's DRA driver: the plugin's state.
pub struct Driver<'a> {
    pub ops: &'a dyn HostOps,
    pub me: Identity,
    pub default: Policy,
    pub boot_id: String,
    pub checkpoint_path: PathBuf,
    pub(super) checkpoint: Checkpoint,
    /// Every device name health was ever reported for (a device that vanishes stays on the
    /// health stream as unhealthy).
    known: BTreeSet<String>,
    /// What the kernel's signals were last time (signals.rs).
    tracker: signals::Tracker,
    /// The unhealthy devices of the last health refresh, with their problem's code.
    unhealthy: BTreeMap<String, &'static str>,
    /// The longest wait for the engine's lock ([`DEFAULT_LOCK_WAIT`]); a call's deadline
    /// shortens it.
    pub lock_wait: Duration,
    /// Whether groups that need a driver switch are published with binding conditions and
    /// bound before their Pod is ([`super::binding`]); off by default.
    pub binding_conditions: bool,
}

/// One device's health (the kit's).
pub use crate::containers::kubelet::plugin::Health;

impl<'a> Driver<'a> {
    pub fn new(
        ops: &'a dyn HostOps,
        me: Identity,
        default: Policy,
        boot_id: String,
    ) -> Result<Self, PrepareError> {
        let checkpoint_path = checkpoint::path(ops.root(), &me.driver);
        let checkpoint = checkpoint::load(&checkpoint_path)?;
        Ok(Driver {
            ops,
            me,
            default,
            boot_id,
            checkpoint_path,
            checkpoint,
            known: BTreeSet::new(),
            tracker: signals::Tracker::default(),
            unhealthy: BTreeMap::new(),
            lock_wait: DEFAULT_LOCK_WAIT,
            binding_conditions: false,
        })
    }

    /// Wait at most `wait` for the engine's lock.
    pub fn with_lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    /// The lock wait of a call due by `deadline`: [`Driver::lock_wait`], or what is left of
    /// the deadline less [`DEADLINE_MARGIN`] when that is shorter (none left: one try).
    pub fn wait_for(&self, deadline: Option<Instant>) -> Duration {
        match deadline {
            Some(d) => self.lock_wait.min(
                d.saturating_duration_since(Instant::now())
                    .saturating_sub(DEADLINE_MARGIN),
            ),
            None => self.lock_wait,
        }
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    pub(super) fn save(&self) -> Result<(), PrepareError> {
        Ok(checkpoint::save(&self.checkpoint_path, &self.checkpoint)?)
    }

    pub(super) fn scan(&self) -> Result<Inventory, PrepareError> {
        Ok(crate::inventory::scan(self.ops.root())?)
    }

    /// The devices of a claim prepared in this boot, as its Prepare returned them: what a
    /// retry returns without reading the claim or touching the host.
    pub fn prepared(&self, c: &ClaimRef) -> Option<Vec<PreparedDevice>> {
        let e = self.checkpoint.claims.get(&c.uid)?;
        if e.boot_id == self.boot_id && e.state == State::Completed {
            return e.prepared.as_ref().map(|p| p.devices.clone());
        }
        None
    }

    /// [`Driver::prepare_until`] without a deadline.
    pub fn prepare(&mut self, c: &Claim) -> Result<Vec<PreparedDevice>, PrepareError> {
        self.prepare_until(c, None)
    }

    /// NodePrepareResources for one claim (read by the kit), due by `deadline` (the gRPC
    /// call's). Idempotent: a claim prepared in this boot returns what it returned before
    /// without touching the host; one whose Prepare was interrupted is prepared again (the
    /// bind is idempotent) keeping the drivers of the first attempt. The host changes are one
    /// plan owned by the claim ([`apply::prepare`]): a failure rolls all of it back.
    pub fn prepare_until(
        &mut self,
        claim: &Claim,
        deadline: Option<Instant>,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let c = &claim.asked;
        if let Some(devices) = self.prepared(c) {
            return Ok(devices);
        }
        let label = format!("{}/{} ({})", c.namespace, c.name, c.uid);
        let inv = self.scan()?;
        let offered = claim::Offered::of(&self.as_offered(&inv));
        let mut checked = claim::check(c, &claim.object, &self.me, &offered, self.default)?;
        claim::precheck_backend(&inv, &checked)?;
        claim::precheck_kvm(self.ops.root(), &checked)?;
        self.choose_mdevs(&inv, &label, &mut checked)?;
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
        let previous = self.checkpoint.claims.get(&c.uid).cloned();
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
        let driver = self.me.driver.clone();
        let mut prepared: Option<Prepared> = None;
        let mut files =
            |h: &crate::host::HostRoot, after: &Inventory| -> Result<Vec<apply::File>, apply::FilesError> {
                let backend = claim::choose_backend(after, &checked)?;
                let mut p = claim::result(after, &driver, &checked, backend);
                // KEP-5304: a metadata file rewritten gets the next generation.
                for f in &mut p.files {
                    let old = crate::host::read_bounded_bytes(&h.path(&f.path), 4 << 20)
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok());
                    f.contents = claim::next_metadata(old.as_deref(), &f.contents);
                }
                let files = p
                    .files
                    .iter()
                    .map(|f| apply::File {
                        path: f.path.clone(),
                        contents: Some(f.contents.clone()),
                    })
                    .collect();
                prepared = Some(p);
                Ok(files)
            };
        // Every member is named, those already on VFIO too: the bind planner refuses a group
        // member of another slot that was not named.
        let mdevs = mdevs_of(&checked.devices);
        let r = apply::prepare(
            self.ops,
            self.wait_for(deadline),
            &apply::Owner::claim(&c.uid, &label),
            &format!("files of claim {label}"),
            &members,
            &mdevs,
            &mut files,
        );
        if let Err(e) = r {
            if e.changed_nothing() {
                // The host holds nothing of this attempt: neither does the checkpoint.
                match previous {
                    Some(p) => self.checkpoint.claims.insert(c.uid.clone(), p),
                    None => self.checkpoint.claims.remove(&c.uid),
                };
                self.save()?;
            }
            return Err(PrepareError::Apply {
                claim: label,
                what: "prepare".into(),
                source: Box::new(e),
            });
        }
        let prepared = prepared.expect("the engine planned the claim's files");
        let devices = prepared.devices.clone();
        if let Some(e) = self.checkpoint.claims.get_mut(&c.uid) {
            e.state = State::Completed;
            e.prepared = Some(prepared);
        }
        self.save()?;
        Ok(devices)
    }

    /// [`Driver::unprepare_until`] without a deadline.
    pub fn unprepare(&mut self, uid: &str) -> Result<(), PrepareError> {
        self.unprepare_until(uid, None)
    }

    /// NodeUnprepareResources for one claim, due by `deadline`: the undo of its prepare as one
    /// plan owned by the claim ([`apply::unprepare`]): its files removed, the functions it
    /// moved given back to the drivers the journal recorded (only in the boot that moved them;
    /// a function on vfio-pci before gpupass touched it stays there), its entry dropped. A
    /// claim the plugin does not know is done already.
    pub fn unprepare_until(&mut self, uid: &str, deadline: Option<Instant>) -> Result<(), PrepareError> {
        let Some(e) = self.checkpoint.claims.get(uid).cloned() else {
            return Ok(());
        };
        let label = format!("{}/{} ({})", e.claim.namespace, e.claim.name, e.claim.uid);
        let (moved, mdevs) = if e.boot_id == self.boot_id {
            (e.moved(), mdevs_of(&e.devices))
        } else {
            // The old kernel's binds and mediated devices went with it.
            (Vec::new(), Vec::new())
        };
        let files = files_of(&self.me.driver, &e);
        apply::unprepare(
            self.ops,
            self.wait_for(deadline),
            &apply::owner(uid),
            &format!("files of claim {label}"),
            &moved,
            &mdevs,
            &files,
        )
        .map_err(|err| PrepareError::Apply {
            claim: label.clone(),
            what: "unprepare".into(),
            source: Box::new(err),
        })?;
        self.checkpoint.claims.remove(uid);
        self.save()
    }

    /// At start: first the plugin's own unfinished plans (a Prepare or Unprepare the plugin
    /// died in, left open in the journal: every later plan on those functions would be
    /// refused until `gpupass recover`) are undone, so the host is as it was before that call
    /// and the kubelet's retry starts clean; plans of other owners (a `gpupass bind` that
    /// died) stay for `gpupass recover`. Then claims of an earlier boot lose their files
    /// (their binds went with that kernel), and claims `claims` (the API server) no longer has
    /// (deleted while the plugin was down) are unprepared. Returns what was done, one line
    /// each.
    pub fn cleanup_at_start(&mut self, claims: &dyn ClaimSource) -> Vec<String> {
        let mut out = self.undo_own_unfinished();
        let entries: Vec<Entry> = self.checkpoint.claims.values().cloned().collect();
        for e in entries {
            let gone = if e.boot_id != self.boot_id {
                Some("prepared before the node rebooted".to_string())
            } else {
                match claims.get(&e.claim.namespace, &e.claim.name) {
                    Err(SourceError::NotFound { .. }) => Some("deleted".to_string()),
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

    /// Undo the unfinished plans owned by claims ([`apply::is_claims`]), newest first.
    fn undo_own_unfinished(&mut self) -> Vec<String> {
        let refresh = &mut apply::Refresh;
        match crate::change::recover_where(self.ops, false, false, self.lock_wait, &apply::is_claims, refresh)
        {
            Ok(r) if r.changed => {
                let mut out =
                    vec!["a Prepare or Unprepare interrupted before this start was undone:".to_string()];
                out.extend(r.lines);
                out
            }
            Ok(_) => Vec::new(),
            Err(e) => vec![format!(
                "the unfinished plans of claims could not be undone (gpupass recover can): {}",
                crate::model::ErrorChain(&e)
            )],
        }
    }

    /// The inventory as this node's ResourceSlices describe it: the functions a claim of this
    /// boot moved to vfio-pci carry the driver they had before (a Prepare does not change
    /// what the node offers, so it does not republish the pool).
    pub fn as_offered(&self, inv: &Inventory) -> Inventory {
        let mut v = inv.clone();
        for e in self
            .checkpoint
            .claims
            .values()
            .filter(|e| e.boot_id == self.boot_id)
        {
            for (a, before) in &e.drivers_before {
                if let Some(d) = v.devices.iter_mut().find(|d| d.address == *a) {
                    d.driver = before.clone();
                }
            }
            // A claim's mediated device is its slot, still allocated: the instance is not
            // counted as the parent's, and its type has that instance available again.
            for m in e.devices.iter().filter_map(|d| d.mdev.as_ref()) {
                let Some(i) = v.mdevs.iter().position(|x| x.uuid == m.uuid) else {
                    continue;
                };
                v.mdevs.remove(i);
                v.groups
                    .retain(|g| !(g.mdev_members == [m.uuid.clone()] && g.members.is_empty()));
                let types = match m.parent.parse::<PciAddress>() {
                    Ok(a) => v
                        .devices
                        .iter_mut()
                        .find(|d| d.address == a)
                        .map(|d| &mut d.mdev_types),
                    Err(_) => v
                        .mdev_parents
                        .iter_mut()
                        .find(|p| p.name == m.parent)
                        .map(|p| &mut p.mdev_types),
                };
                if let Some(t) = types.and_then(|ts| ts.iter_mut().find(|t| t.id == m.mdev_type)) {
                    t.available_instances = t.available_instances.map(|n| n + 1);
                }
            }
        }
        v
    }

    /// Give each mdev slot of `checked` its instance's UUID: the one an earlier attempt of this
    /// claim in this boot chose (saved in the checkpoint before that attempt created anything),
    /// else a new random one; and, for an instance not created yet, refuse now when the kernel
    /// says its type has no instance left.
    fn choose_mdevs(
        &self,
        inv: &Inventory,
        label: &str,
        checked: &mut claim::Checked,
    ) -> Result<(), PrepareError> {
        let earlier = self
            .checkpoint
            .claims
            .get(&checked.claim.uid)
            .filter(|e| e.boot_id == self.boot_id);
        for d in checked.devices.iter_mut() {
            let Some(m) = d.mdev.as_mut() else { continue };
            let before = earlier
                .and_then(|e| e.devices.iter().find(|x| x.device == d.device))
                .and_then(|x| x.mdev.as_ref())
                .map(|x| x.uuid.clone())
                .filter(|u| !u.is_empty());
            m.uuid = match before {
                Some(u) => u,
                None => crate::mdev::MdevUuid::random()
                    .map_err(|e| PrepareError::Mdev {
                        claim: label.to_string(),
                        problem: e.to_string(),
                    })?
                    .to_string(),
            };
            if inv.mdev(&m.uuid).is_some() {
                continue;
            }
            let avail = super::slots::parents(inv)
                .into_iter()
                .find(|(p, _, _)| *p == m.parent)
                .and_then(|(_, _, types)| types.iter().find(|t| t.id == m.mdev_type).cloned())
                .and_then(|t| t.available_instances);
            if avail.unwrap_or(0) == 0 {
                return Err(PrepareError::Mdev {
                    claim: label.to_string(),
                    problem: format!(
                        "mdev type {} on {} has no instance left (the kernel's available_instances is {}): another type or user took the parent's capacity; the kubelet retries, and the node's slices are republished with the kernel's counts",
                        m.mdev_type,
                        m.parent,
                        avail.map_or("absent".to_string(), |n| n.to_string())
                    ),
                });
            }
        }
        Ok(())
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
        let mut h = health(inv, &prepared, &self.known);
        self.known.extend(h.iter().map(|(d, _)| d.device.clone()));
        // The kernel's signals of each healthy device's functions (signals.rs).
        let now = Instant::now();
        let held: BTreeMap<&PciAddress, ()> = prepared
            .iter()
            .flat_map(|e| e.devices.iter().flat_map(|d| d.members.iter()))
            .map(|a| (a, ()))
            .collect();
        let mut members: BTreeMap<String, Vec<PciAddress>> = slices::publishable(inv)
            .into_iter()
            .map(|p| (p.name, p.members))
            .collect();
        for e in &prepared {
            for d in &e.devices {
                members
                    .entry(d.device.clone())
                    .or_insert_with(|| d.members.clone());
            }
        }
        for (dev, code) in h.iter_mut() {
            let Some(ms) = members.get(&dev.device) else {
                continue;
            };
            for a in ms {
                let Some(f) = inv.device(a) else { continue };
                let r = signals::read(self.ops.root(), a);
                let p = self
                    .tracker
                    .judge(a, f.driver.as_deref(), held.contains_key(a), &r, now);
                if let (Some(p), true) = (p, dev.healthy) {
                    dev.healthy = false;
                    dev.message = p.message;
                    *code = Some(p.code);
                }
            }
        }
        self.unhealthy = h
            .iter()
            .filter_map(|(d, c)| c.map(|c| (d.device.clone(), c)))
            .collect();
        h.into_iter().map(|(d, _)| d).collect()
    }
}

impl DraDriver for Driver<'_> {
    type Error = PrepareError;

    fn start(&mut self, claims: &dyn ClaimSource) -> Vec<String> {
        self.cleanup_at_start(claims)
    }

    fn prepared(&self, claim: &ClaimRef) -> Option<Vec<PreparedDevice>> {
        Driver::prepared(self, claim)
    }

    fn prepare_resource_claims(
        &mut self,
        claims: &[Claim],
        deadline: Option<Instant>,
    ) -> BTreeMap<String, Result<Vec<PreparedDevice>, PrepareError>> {
        claims
            .iter()
            .map(|c| (c.asked.uid.clone(), self.prepare_until(c, deadline)))
            .collect()
    }

    fn unprepare_resource_claims(
        &mut self,
        claims: &[ClaimRef],
        deadline: Option<Instant>,
    ) -> BTreeMap<String, Result<(), PrepareError>> {
        claims
            .iter()
            .map(|c| (c.uid.clone(), self.unprepare_until(&c.uid, deadline)))
            .collect()
    }

    /// The pool as published ([`Driver::as_offered`]: a Prepare does not change what the
    /// node offers) and the health of the host as it is.
    fn resources(&mut self) -> Result<Resources, PrepareError> {
        let inv = self.scan()?;
        let health = self.health(&inv);
        let offered = self.as_offered(&inv);
        let mut pool = slices::pool(&offered);
        if self.binding_conditions {
            super::binding::mark(&mut pool, &offered);
        }
        Ok(Resources {
            // An unhealthy device is tainted (NoSchedule): the scheduler gives it only to a
            // claim that tolerates the taint, which Prepare then serves like any other.
            pool: tainted(pool, &self.unhealthy),
            health,
        })
    }

    fn bind_before_binding(
        &mut self,
        claim: &Claim,
        devices: &[crate::containers::kubelet::binding::DeviceKey],
    ) -> Result<String, crate::containers::kubelet::binding::Failure> {
        self.bind_early(claim, devices)
    }

    fn release_before_binding(&mut self, gone: &dyn Fn(&ClaimRef) -> bool) -> Vec<String> {
        self.release_early(gone)
    }
}

/// The files a claim may have written (from its result, or from its devices when Prepare
/// stopped before the result).
/// The mediated devices of a claim's mdev slots (those with a UUID chosen).
fn mdevs_of(devices: &[claim::ClaimDevice]) -> Vec<apply::Mdev> {
    devices
        .iter()
        .filter_map(|d| d.mdev.as_ref())
        .filter(|m| !m.uuid.is_empty())
        .map(|m| apply::Mdev {
            uuid: m.uuid.clone(),
            parent: m.parent.clone(),
            mdev_type: m.mdev_type.clone(),
        })
        .collect()
}

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

/// Health, pure: see [`Driver::health`]. Each unhealthy device with its problem's code (the
/// taint's value).
pub fn health(
    inv: &Inventory,
    prepared: &[&Entry],
    known: &BTreeSet<String>,
) -> Vec<(Health, Option<&'static str>)> {
    let mut out: BTreeMap<String, (Health, Option<&'static str>)> = BTreeMap::new();
    let healthy = |name: &str| {
        (
            Health {
                device: name.to_string(),
                healthy: true,
                message: String::new(),
            },
            None,
        )
    };
    let slots: Vec<String> = super::slots::offered(inv).into_iter().map(|s| s.name).collect();
    for name in slices::publishable(inv).into_iter().map(|p| p.name).chain(slots) {
        out.insert(name.clone(), healthy(&name));
    }
    for e in prepared {
        for d in &e.devices {
            let mut problem: Option<Problem> = None;
            if let Some(m) = &d.mdev {
                match inv.mdev(&m.uuid) {
                    None => {
                        problem = Some(Problem::new(
                            "gone",
                            format!("mdev {} ({} on {}) is gone", m.uuid, m.mdev_type, m.parent),
                        ))
                    }
                    Some(i) if i.iommu_group.is_none() => {
                        problem = Some(Problem::new(
                            "no-group",
                            format!("mdev {} has no IOMMU group any more", m.uuid),
                        ))
                    }
                    Some(_) => {}
                }
            }
            for a in &d.members {
                let Some(f) = inv.device(a) else {
                    problem = Some(Problem::new("gone", format!("{a} is gone")));
                    break;
                };
                if let Err(r) = inv.vfio_group(f) {
                    let who = r.blocker_list();
                    problem = Some(Problem::new(
                        "left-vfio",
                        if who.is_empty() {
                            format!("{a}: {r}")
                        } else {
                            format!("{a}: {r}: {who} left VFIO behind gpupass's back")
                        },
                    ));
                    break;
                }
            }
            out.insert(
                d.device.clone(),
                (
                    Health {
                        device: d.device.clone(),
                        healthy: problem.is_none(),
                        message: problem.as_ref().map(|p| p.message.clone()).unwrap_or_default(),
                    },
                    problem.map(|p| p.code),
                ),
            );
        }
    }
    // A slot that is no longer offered (its type filled up) is not a failed device: only
    // prepared slots are judged, above.
    for k in known.iter().filter(|k| !k.starts_with("mdev-")) {
        out.entry(k.clone()).or_insert_with(|| {
            (
                Health {
                    device: k.clone(),
                    healthy: false,
                    message: "no longer on this node (removed, or its IOMMU group changed)".into(),
                },
                Some("gone"),
            )
        });
    }
    out.into_values().collect()
}

/// The key of the taint an unhealthy device is published with (its value: the problem's code).
pub const TAINT_KEY: &str = "gpupass.dev/unhealthy";

/// The effect of that taint: NoSchedule (docs/dra.md, "Taints": new claims do not get the
/// device; a Pod that has it keeps running, and its status says Unhealthy).
pub const TAINT_EFFECT: &str = "NoSchedule";

/// `pool` with a [`TAINT_KEY`] taint on each device `unhealthy` names (device name → code).
pub fn tainted(mut pool: Pool, unhealthy: &BTreeMap<String, &'static str>) -> Pool {
    for d in &mut pool.devices {
        if let Some(code) = unhealthy.get(&d.name) {
            d.taints.get_or_insert_with(Vec::new).push(DeviceTaint {
                key: TAINT_KEY.into(),
                value: Some((*code).into()),
                effect: TAINT_EFFECT.into(),
                time_added: None,
            });
        }
    }
    pool
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::containers::kubelet::claims::{fetch, Dir};
    use crate::host::HostRoot;
    use crate::testkit::hostgen::{DevSpec, HostBuilder};
    use crate::testkit::FakeHost;
    use std::time::{Duration, Instant};

    fn driver_of(root: &std::path::Path, a: &str) -> Option<String> {
        std::fs::read_link(root.join("sys/bus/pci/devices").join(a).join("driver"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
    }

    const DRIVER: &str = "vfio.gpupass.dev";

    fn node_a() -> Identity {
        Identity {
            driver: DRIVER.into(),
            node: "node-a".into(),
            pool: "node-a".into(),
        }
    }

    fn gpu_claim() -> ClaimRef {
        ClaimRef {
            namespace: "default".into(),
            uid: "u1".into(),
            name: "gpu".into(),
        }
    }

    /// The lab's IOMMU group 4 (a VGA function on bochs-drm and its audio companion on
    /// snd_hda_intel, one DRA device `pci-0000-00-05-0`) and the claim default/gpu (UID u1)
    /// allocated that device on node-a. Returns the scratch directory, the host root and the
    /// claims directory.
    fn lab_claim() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        lab_claim_with(|_| {})
    }

    /// [`lab_claim`], with `more` added to the host.
    fn lab_claim_with(
        more: impl FnOnce(&mut HostBuilder),
    ) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("host");
        let mut h = HostBuilder::new(&root).unwrap();
        h.kernel("6.1.0-57-amd64", "intel_iommu=on", &["bochs", "snd_hda_intel"])
            .unwrap();
        h.add(
            &DevSpec::new("00:05.0", 0x1234, 0x1111, 0x030000)
                .group(4)
                .driver("bochs-drm"),
        )
        .unwrap();
        h.add(
            &DevSpec::new("00:05.1", 0x8086, 0x293e, 0x040300)
                .group(4)
                .driver("snd_hda_intel"),
        )
        .unwrap();
        h.file("dev/vfio/vfio", "").unwrap();
        more(&mut h);
        let claims = t.path().join("claims");
        std::fs::create_dir_all(claims.join("default")).unwrap();
        let c = serde_json::json!({
            "metadata": {"name": "gpu", "namespace": "default", "uid": "u1"},
            "status": {"allocation": {
                "devices": {"results": [{"request": "vfio", "driver": DRIVER, "pool": "node-a", "device": "pci-0000-00-05-0"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}
            }}
        });
        std::fs::write(claims.join("default/gpu.json"), c.to_string()).unwrap();
        (t, root, claims)
    }

    /// The driver as the kubelet-plugin kit drives it, with claims read from `claims`: a
    /// claim prepared already is answered from the checkpoint, any other is read and handed
    /// to the driver ([`crate::containers::kubelet::plugin`]'s worker does the same).
    struct Kit<'a> {
        d: Driver<'a>,
        src: Dir,
    }

    impl<'a> std::ops::Deref for Kit<'a> {
        type Target = Driver<'a>;
        fn deref(&self) -> &Driver<'a> {
            &self.d
        }
    }

    impl std::ops::DerefMut for Kit<'_> {
        fn deref_mut(&mut self) -> &mut Self::Target {
            &mut self.d
        }
    }

    impl Kit<'_> {
        fn prepare(&mut self, c: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
            self.prepare_until(c, None)
        }

        fn prepare_until(
            &mut self,
            c: &ClaimRef,
            deadline: Option<Instant>,
        ) -> Result<Vec<PreparedDevice>, PrepareError> {
            if let Some(d) = self.d.prepared(c) {
                return Ok(d);
            }
            let claim = fetch(&self.src, c).expect("the claim is readable");
            self.d.prepare_until(&claim, deadline)
        }

        fn cleanup_at_start(&mut self) -> Vec<String> {
            self.d.cleanup_at_start(&self.src)
        }

        fn with_lock_wait(self, wait: Duration) -> Self {
            Kit {
                d: self.d.with_lock_wait(wait),
                src: self.src,
            }
        }
    }

    fn kit<'a>(d: Driver<'a>, claims: &std::path::Path) -> Kit<'a> {
        Kit {
            d,
            src: Dir {
                dir: claims.to_path_buf(),
            },
        }
    }

    fn engine<'a>(ops: &'a dyn HostOps, claims: &std::path::Path) -> Kit<'a> {
        kit(
            Driver::new(ops, node_a(), Policy::Auto, "b1".into()).unwrap(),
            claims,
        )
    }

    /// What a claim's plan changes on the host: each function's driver and override, whether
    /// the group's VFIO node exists, and every file (path and content) under the CDI spec
    /// directory and the plugin's metadata directory. (Not the checkpoint, the journal, or
    /// the fake kernel's own bookkeeping.)
    fn state(root: &std::path::Path) -> BTreeMap<String, String> {
        fn files(base: &std::path::Path, dir: &std::path::Path, out: &mut BTreeMap<String, String>) {
            let Ok(rd) = std::fs::read_dir(dir) else { return };
            for e in rd {
                let p = e.unwrap().path();
                if p.is_dir() {
                    files(base, &p, out);
                } else {
                    let rel = p.strip_prefix(base).unwrap().display().to_string();
                    out.insert(rel, std::fs::read_to_string(&p).unwrap());
                }
            }
        }
        let mut m = BTreeMap::new();
        for a in ["0000:00:05.0", "0000:00:05.1"] {
            m.insert(format!("{a} driver"), driver_of(root, a).unwrap_or_default());
            let ov =
                std::fs::read_to_string(root.join("sys/bus/pci/devices").join(a).join("driver_override"))
                    .unwrap_or_default();
            m.insert(format!("{a} override"), ov.trim().to_string());
        }
        m.insert("dev/vfio/4".into(), root.join("dev/vfio/4").exists().to_string());
        files(root, &root.join("var/run/cdi"), &mut m);
        files(
            root,
            &root
                .join("var/lib/kubelet/plugins")
                .join(DRIVER)
                .join("dra-device-metadata"),
            &mut m,
        );
        m
    }

    fn journal(root: &std::path::Path) -> String {
        std::fs::read_to_string(crate::change::journal::journal_path(&HostRoot::new(root)))
            .unwrap_or_default()
    }

    /// Prepare is one plan of the change engine owned by the claim: one `change` record (the
    /// group bind and the claim's three files, owner `dra-claim:u1`), one commit. A retry, in
    /// this plugin or a restarted one (the checkpoint by claim UID), returns the same devices
    /// and writes nothing; Unprepare is one plan too and gives the host back as it was.
    #[test]
    fn prepare_is_one_owned_plan_and_retries_write_nothing() {
        let (_t, root, claims) = lab_claim();
        let before = state(&root);
        let ops = FakeHost::new(HostRoot::new(&root));
        let mut e = engine(&ops, &claims);
        let devs = e.prepare(&gpu_claim()).unwrap();
        assert_eq!(devs[0].device, "pci-0000-00-05-0");
        let after = state(&root);
        assert_eq!(after["0000:00:05.0 driver"], "vfio-pci");
        assert_eq!(after["0000:00:05.1 driver"], "vfio-pci");
        assert_eq!(
            after.keys().filter(|k| k.ends_with(".json")).count(),
            3,
            "{after:?}"
        );
        let j = journal(&root);
        assert_eq!(j.matches("\"op\":\"change\"").count(), 1, "{j}");
        assert_eq!(j.matches("\"op\":\"extend\"").count(), 1, "{j}");
        assert_eq!(j.matches("\"owner\":\"dra-claim:u1\"").count(), 1, "{j}");
        assert_eq!(j.matches("\"op\":\"commit\"").count(), 1, "{j}");
        // Six sysfs writes of the bind, three files.
        assert_eq!(j.matches("\"op\":\"step\"").count(), 9, "{j}");
        // kubelet retries: same answer, nothing written; a restarted plugin too.
        assert_eq!(e.prepare(&gpu_claim()).unwrap(), devs);
        let mut restarted = engine(&ops, &claims);
        assert_eq!(restarted.prepare(&gpu_claim()).unwrap(), devs);
        assert_eq!(journal(&root), j);
        assert_eq!(state(&root), after);
        // Unprepare: the plan's undo, one plan owned by the claim (the journal folded the
        // committed prepare into its `state` record first, which keeps what the claim holds),
        // releasing the claim's hold on the group.
        restarted.unprepare("u1").unwrap();
        assert_eq!(state(&root), before);
        let j = journal(&root);
        assert_eq!(j.matches("\"op\":\"change\"").count(), 1, "{j}");
        assert_eq!(
            j.matches("\"owner\":\"dra-claim:u1\",\"changes\"").count(),
            1,
            "{j}"
        );
        assert_eq!(
            j.matches("\"owner\":\"dra-claim:u1\",\"label\"").count(),
            2,
            "{j}"
        );
        assert_eq!(j.matches("\"releases\":true").count(), 1, "{j}");
        let r = crate::change::journal::read(&HostRoot::new(&root)).unwrap();
        assert!(r.held.is_empty(), "{:?}", r.held);
        assert_eq!(j.matches("\"domain\":\"unbind+dra\"").count(), 1, "{j}");
        assert_eq!(j.matches("\"op\":\"step\"").count(), 9, "{j}");
        assert!(!root
            .join("var/lib/kubelet/plugins")
            .join(DRIVER)
            .join("dra-device-metadata/default_gpu")
            .exists());
        assert!(restarted.checkpoint().claims.is_empty());
    }

    /// One owner per group, whatever the scheduler allocated and whatever the plugin's
    /// checkpoint says: the journal records what a live claim holds. A second claim given the
    /// device a live claim holds (a double allocation, as with the scheduler's counters off),
    /// seen by a plugin whose checkpoint was lost (a reinstall), is refused naming the holder
    /// and changes nothing; the host's `gpupass unbind` (and `--all`) refuse to take the
    /// group from under the claim's Pod unless forced; once the first claim is unprepared
    /// the second prepares.
    #[test]
    fn one_owner_per_group_against_a_second_claim_and_the_host() {
        let (_t, root, claims) = lab_claim();
        let c2 = serde_json::json!({
            "metadata": {"name": "gpu2", "namespace": "default", "uid": "u2"},
            "status": {"allocation": {
                "devices": {"results": [{"request": "vfio", "driver": DRIVER, "pool": "node-a", "device": "pci-0000-00-05-0"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}
            }}
        });
        std::fs::write(claims.join("default/gpu2.json"), c2.to_string()).unwrap();
        let second = ClaimRef {
            namespace: "default".into(),
            uid: "u2".into(),
            name: "gpu2".into(),
        };
        let ops = FakeHost::new(HostRoot::new(&root));
        let mut e = engine(&ops, &claims);
        e.prepare(&gpu_claim()).unwrap();
        let held = state(&root);
        let j = journal(&root);
        // A plugin that lost its checkpoint knows nothing of u1: the journal does.
        let cp = root
            .join("var/lib/kubelet/plugins")
            .join(DRIVER)
            .join("checkpoint.json");
        let kept = std::fs::read(&cp).unwrap();
        std::fs::remove_file(&cp).unwrap();
        let mut fresh = engine(&ops, &claims);
        let err = crate::model::ErrorChain(&fresh.prepare(&second).unwrap_err()).to_string();
        assert!(
            err.contains("is held by claim default/gpu (u1)") && err.contains("one owner per group"),
            "{err}"
        );
        assert_eq!(state(&root), held);
        assert_eq!(journal(&root), j, "a refused claim journals nothing");
        assert!(fresh.checkpoint().claims.is_empty());
        drop(fresh);
        std::fs::write(&cp, kept).unwrap();
        let mut e = engine(&ops, &claims);
        let unbind = |addresses: Vec<PciAddress>, all: bool, force: bool| {
            let req = crate::bind::UnbindRequest {
                addresses,
                group: None,
                all,
                only: false,
            };
            crate::bind::apply::unbind(&ops, &req, force, false, &|_| {})
        };
        let vga: PciAddress = "0000:00:05.0".parse().unwrap();
        for all in [false, true] {
            let addrs = if all { Vec::new() } else { vec![vga] };
            let err = crate::model::ErrorChain(&unbind(addrs, all, false).unwrap_err()).to_string();
            assert!(err.contains("held by claim default/gpu (u1)"), "{err}");
            assert!(err.contains("--force"), "{err}");
            assert_eq!(state(&root), held);
        }
        // The claim gone (unprepared), the second one prepares and holds the group in turn.
        e.unprepare("u1").unwrap();
        e.prepare(&second).unwrap();
        let err = crate::model::ErrorChain(&unbind(vec![vga], false, false).unwrap_err()).to_string();
        assert!(err.contains("held by claim default/gpu2 (u2)"), "{err}");
        // Forced, the host takes it back (a claim whose plugin is gone).
        unbind(vec![vga], false, true).unwrap();
        assert_eq!(driver_of(&root, "0000:00:05.0").as_deref(), Some("bochs-drm"));
        // The claim's unprepare then gives back what is left and releases its hold.
        e.unprepare("u2").unwrap();
        let r = crate::change::journal::read(&HostRoot::new(&root)).unwrap();
        assert!(r.held.is_empty(), "{:?}", r.held);
    }

    /// A `require-iommufd` claim on a node whose kernel has no iommufd (this 6.1 host: no
    /// `/dev/iommu`, no VFIO device cdev) is refused before the first write, with the
    /// kernel's reason: no journal record, no checkpoint entry, the group on its drivers, and
    /// every kubelet retry refused the same way without binding and rolling back.
    /// KEP-5304: `metadata.generation` increases on every rewrite of a claim's metadata file.
    /// A Prepare that finds the file saying something else (here: an earlier version at
    /// generation 4 naming another backend, the plugin's checkpoint lost) rewrites it at 5; one
    /// that finds it as wanted leaves it (and its generation) alone.
    #[test]
    fn a_rewritten_metadata_file_gets_a_higher_generation() {
        let (_t, root, claims) = lab_claim();
        let ops = FakeHost::new(HostRoot::new(&root));
        let meta = root
            .join("var/lib/kubelet/plugins")
            .join(DRIVER)
            .join("dra-device-metadata/default_gpu/vfio/metadata.json");
        let gens = || -> Vec<i64> {
            serde_json::Deserializer::from_str(&std::fs::read_to_string(&meta).unwrap())
                .into_iter::<serde_json::Value>()
                .map(|d| d.unwrap()["metadata"]["generation"].as_i64().unwrap())
                .collect()
        };
        let cp = checkpoint::path(&HostRoot::new(&root), DRIVER);
        engine(&ops, &claims).prepare(&gpu_claim()).unwrap();
        assert_eq!(gens(), [1, 1]);
        let now = std::fs::read_to_string(&meta).unwrap();
        assert!(
            now.contains(r#""gpupass.dev/backend":{"string":"legacy"}"#),
            "{now}"
        );
        let earlier = now
            .replace(r#""generation":1"#, r#""generation":4"#)
            .replace(r#"{"string":"legacy"}"#, r#"{"string":"iommufd"}"#);
        std::fs::write(&meta, earlier).unwrap();
        std::fs::remove_file(&cp).unwrap();
        engine(&ops, &claims).prepare(&gpu_claim()).unwrap();
        assert_eq!(gens(), [5, 5]);
        let rewritten = std::fs::read_to_string(&meta).unwrap();
        assert_eq!(rewritten, now.replace(r#""generation":1"#, r#""generation":5"#));
        let written = |p: &std::path::Path| {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(p).unwrap();
            (m.ino(), m.mtime(), m.mtime_nsec())
        };
        let before = written(&meta);
        std::fs::remove_file(&cp).unwrap();
        engine(&ops, &claims).prepare(&gpu_claim()).unwrap();
        assert_eq!(gens(), [5, 5], "the same content is no rewrite");
        assert_eq!(std::fs::read_to_string(&meta).unwrap(), rewritten);
        assert_eq!(written(&meta), before, "the file was not written again");
    }

    #[test]
    fn require_iommufd_on_a_kernel_without_it_is_refused_before_any_write() {
        let (_t, root, claims) = lab_claim();
        let c = serde_json::json!({
            "metadata": {"name": "gpu", "namespace": "default", "uid": "u1"},
            "status": {"allocation": {
                "devices": {
                    "results": [{"request": "vfio", "driver": DRIVER, "pool": "node-a", "device": "pci-0000-00-05-0"}],
                    "config": [{"source": "FromClaim", "requests": ["vfio"], "opaque": {"driver": DRIVER, "parameters": {
                        "apiVersion": claim::CONFIG_API_VERSION, "kind": claim::CONFIG_KIND, "backendPolicy": "require-iommufd"}}}]
                },
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}
            }}
        });
        std::fs::write(claims.join("default/gpu.json"), c.to_string()).unwrap();
        let before = state(&root);
        let ops = FakeHost::new(HostRoot::new(&root));
        let mut e = engine(&ops, &claims);
        for attempt in 0..2 {
            let err = e.prepare(&gpu_claim()).unwrap_err();
            let msg = crate::model::ErrorChain(&err).to_string();
            assert!(msg.contains("require-iommufd"), "attempt {attempt}: {msg}");
            assert!(msg.contains("0000:00:05.0"), "attempt {attempt}: {msg}");
            assert!(
                msg.contains("use prefer-iommufd or legacy"),
                "attempt {attempt}: {msg}"
            );
            assert_eq!(state(&root), before, "attempt {attempt}");
            assert_eq!(journal(&root), "", "attempt {attempt}: nothing journaled");
            assert!(e.checkpoint().claims.is_empty(), "attempt {attempt}");
        }
    }

    /// A prepared claim does not change what the node offers: the slices rendered from the
    /// host while the group is on vfio-pci equal the ones from before the Prepare (the
    /// `driver` attribute keeps the driver the function had), so the pool is not republished.
    #[test]
    fn a_prepared_group_is_offered_as_it_was_before() {
        let (_t, root, claims) = lab_claim();
        let ops = FakeHost::new(HostRoot::new(&root));
        let host = HostRoot::new(&root);
        let before = super::super::slices::devices(&crate::inventory::scan(&host).unwrap());
        let mut e = engine(&ops, &claims);
        e.prepare(&gpu_claim()).unwrap();
        let now = crate::inventory::scan(&host).unwrap();
        assert_ne!(
            super::super::slices::devices(&now),
            before,
            "the bind changed the driver attribute"
        );
        assert_eq!(super::super::slices::devices(&e.as_offered(&now)), before);
        e.unprepare("u1").unwrap();
        let after = crate::inventory::scan(&host).unwrap();
        assert_eq!(super::super::slices::devices(&e.as_offered(&after)), before);
    }

    /// The kernel's signals reach the pool: a function that lost its host driver makes its
    /// device unhealthy and tainted NoSchedule (driver-lost); a claim for it is prepared all
    /// the same (the scheduler let it through: a toleration); prepared and on vfio-pci it is
    /// healthy, in D3cold it is not; given back driverless it is tainted again, and a driver
    /// clears it.
    #[test]
    fn an_unhealthy_device_is_tainted_and_a_claim_for_it_is_prepared_all_the_same() {
        let (_t, root, claims) = lab_claim();
        let ops = FakeHost::new(HostRoot::new(&root));
        let mut e = engine(&ops, &claims);
        let dev = "pci-0000-00-05-0";
        let look = |e: &mut Kit| {
            let r = DraDriver::resources(&mut e.d).unwrap();
            let h = r.health.iter().find(|h| h.device == dev).cloned().unwrap();
            let d = r.pool.devices.iter().find(|d| d.name == dev).cloned().unwrap();
            let t: Vec<(String, String)> = d
                .taints
                .unwrap_or_default()
                .into_iter()
                .map(|t| (t.value.unwrap_or_default(), t.effect))
                .collect();
            (h, t)
        };
        let (h, t) = look(&mut e);
        assert!(h.healthy && t.is_empty(), "{h:?} {t:?}");
        let link = root.join("sys/bus/pci/devices/0000:00:05.1/driver");
        let target = std::fs::read_link(&link).unwrap();
        std::fs::remove_file(&link).unwrap();
        let (h, t) = look(&mut e);
        assert!(!h.healthy, "{h:?}");
        assert!(
            h.message.contains("0000:00:05.1 lost its driver snd_hda_intel"),
            "{}",
            h.message
        );
        assert_eq!(t, [("driver-lost".to_string(), "NoSchedule".to_string())]);
        // Tolerated by the claim (the scheduler's business): Prepare does not refuse it.
        e.prepare(&gpu_claim()).unwrap();
        let (h, t) = look(&mut e);
        assert!(
            h.healthy && t.is_empty(),
            "prepared, both on vfio-pci: {h:?} {t:?}"
        );
        let ps = root.join("sys/bus/pci/devices/0000:00:05.0/power_state");
        std::fs::write(&ps, "D3cold\n").unwrap();
        let (h, t) = look(&mut e);
        assert!(!h.healthy && h.message.contains("D3cold"), "{h:?}");
        assert_eq!(t, [("d3cold".to_string(), "NoSchedule".to_string())]);
        std::fs::write(&ps, "D0\n").unwrap();
        assert!(look(&mut e).0.healthy);
        e.unprepare("u1").unwrap();
        let (h, t) = look(&mut e);
        assert!(!h.healthy && t.len() == 1, "given back driverless: {h:?} {t:?}");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let (h, t) = look(&mut e);
        assert!(h.healthy && t.is_empty(), "{h:?} {t:?}");
    }

    /// A failure at any write of the prepare plan rolls the whole plan back (the bind and the
    /// files already written); the checkpoint holds nothing, and the retry prepares the claim.
    #[test]
    fn a_failure_at_every_write_of_a_prepare_rolls_it_all_back() {
        for k in 1..=9 {
            let (_t, root, claims) = lab_claim();
            let before = state(&root);
            let ops = crate::testkit::Failpoints::new(FakeHost::new(HostRoot::new(&root))).fail_at(k);
            let mut e = engine(&ops, &claims);
            let err = e.prepare(&gpu_claim()).unwrap_err();
            let msg = crate::model::ErrorChain(&err).to_string();
            assert!(msg.contains("rolled back, nothing changed"), "write {k}: {msg}");
            assert!(msg.contains("injected failure"), "write {k}: {msg}");
            assert_eq!(state(&root), before, "write {k}");
            assert!(e.checkpoint().claims.is_empty(), "write {k}");
            let r = crate::change::journal::read(&HostRoot::new(&root)).unwrap();
            assert!(r.open.is_empty() && r.bound.is_empty(), "write {k}");
            // The retry (the failpoint spent) prepares it.
            let fresh = FakeHost::new(HostRoot::new(&root));
            engine(&fresh, &claims).prepare(&gpu_claim()).unwrap();
            assert_eq!(driver_of(&root, "0000:00:05.1").as_deref(), Some("vfio-pci"));
        }
    }

    /// The plugin dying after each write of a prepare (the test kit's crash failpoint, as a
    /// panic the test survives) leaves the claim's plan open in the journal, owned by the
    /// claim; `gpupass recover` puts the host back as it was before the Prepare. `recover
    /// --continue` after a write of the files makes it exactly what a Prepare without a crash
    /// makes; after a write of the bind (the files not planned yet: they are planned from the
    /// host the bind leaves) it finishes the bind and writes no file. After either, the
    /// kubelet's retry (a restarted plugin, the checkpoint's `started` entry) prepares the
    /// claim and Unprepare gives the host back.
    #[test]
    fn a_crash_after_every_write_of_a_prepare_is_recovered_to_before_or_prepared() {
        let prepared = {
            let (_t, root, claims) = lab_claim();
            let ops = FakeHost::new(HostRoot::new(&root));
            engine(&ops, &claims).prepare(&gpu_claim()).unwrap();
            state(&root)
        };
        for n in 1..=9 {
            for cont in [false, true] {
                let (_t, root, claims) = lab_claim();
                let host = HostRoot::new(&root);
                let before = state(&root);
                let crashing = crate::testkit::Failpoints::new(FakeHost::new(host.clone())).panic_after(n);
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    engine(&crashing, &claims).prepare(&gpu_claim())
                }));
                assert!(r.is_err(), "write {n}: no crash");
                let open = crate::change::journal::read(&host).unwrap().open;
                assert_eq!(open.len(), 1, "write {n}");
                assert_eq!(open[0].owner.as_deref(), Some("dra-claim:u1"));
                assert_eq!(
                    (open[0].at, open[0].writes),
                    (n, if n <= 6 { 6 } else { 9 }),
                    "write {n}"
                );
                assert_ne!(state(&root), before, "write {n} changed nothing");
                let ops = FakeHost::new(host.clone());
                crate::change::recover(&ops, cont, false).unwrap();
                assert!(crate::change::journal::read(&host).unwrap().open.is_empty());
                if cont && n > 6 {
                    assert_eq!(state(&root), prepared, "recover --continue after write {n}");
                } else if cont {
                    let bound: BTreeMap<String, String> = prepared
                        .iter()
                        .filter(|(k, _)| !k.ends_with(".json"))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    assert_eq!(state(&root), bound, "recover --continue after write {n}");
                } else {
                    assert_eq!(state(&root), before, "recover after write {n}");
                }
                // The kubelet retries with a restarted plugin: prepared; then unprepared.
                let mut e = engine(&ops, &claims);
                assert_eq!(e.checkpoint().claims["u1"].state, State::Started);
                e.prepare(&gpu_claim()).unwrap();
                assert_eq!(state(&root), prepared, "retry after write {n} (continue: {cont})");
                e.unprepare("u1").unwrap();
                assert_eq!(
                    state(&root),
                    before,
                    "unprepare after write {n} (continue: {cont})"
                );
            }
        }
    }

    /// The plugin dying after each write of an Unprepare (six sysfs writes of the restore,
    /// three file removals), then starting again: its start undoes the unfinished plan (the
    /// claim prepared as it was, the journal closed), the checkpoint still holds the claim, and
    /// the kubelet's retry of the Unprepare gives the host back as it was before the Prepare.
    #[test]
    fn a_crash_after_every_write_of_an_unprepare_is_undone_at_start_and_the_retry_finishes() {
        for n in 1..=9 {
            let (_t, root, claims) = lab_claim();
            let host = HostRoot::new(&root);
            let before = state(&root);
            let ops = FakeHost::new(host.clone());
            engine(&ops, &claims).prepare(&gpu_claim()).unwrap();
            let prepared = state(&root);
            let crashing = crate::testkit::Failpoints::new(FakeHost::new(host.clone())).panic_after(n);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                engine(&crashing, &claims).unprepare("u1")
            }));
            assert!(r.is_err(), "write {n}: no crash");
            let open = crate::change::journal::read(&host).unwrap().open;
            assert_eq!(open.len(), 1, "write {n}");
            assert_eq!(open[0].owner.as_deref(), Some("dra-claim:u1"));
            assert_eq!((open[0].at, open[0].writes), (n, 9), "write {n}");
            assert_ne!(state(&root), prepared, "write {n} changed nothing");
            // The restarted plugin: its own unfinished plan undone before it serves.
            let mut e = engine(&ops, &claims);
            let said = e.cleanup_at_start();
            assert!(
                said.iter()
                    .any(|l| l.contains("interrupted before this start was undone")),
                "write {n}: {said:?}"
            );
            assert!(
                crate::change::journal::read(&host).unwrap().open.is_empty(),
                "write {n}"
            );
            assert_eq!(state(&root), prepared, "undone after write {n}");
            assert_eq!(e.checkpoint().claims["u1"].state, State::Completed, "write {n}");
            // The kubelet retries the Unprepare.
            e.unprepare("u1").unwrap();
            assert_eq!(state(&root), before, "retried unprepare after write {n}");
            assert!(e.checkpoint().claims.is_empty(), "write {n}");
        }
    }

    /// The plugin dying after each write of a prepare, then starting again: before anything
    /// else it undoes its own unfinished plan (the host as before the Prepare, the journal
    /// closed), so the kubelet's retry prepares the claim instead of being refused for an
    /// unfinished plan; a `gpupass bind` that died beside it (another owner) stays open for
    /// `gpupass recover`, its function untouched.
    #[test]
    fn a_restarted_plugin_undoes_its_own_unfinished_prepare_and_nothing_else() {
        for n in 1..=9 {
            let (_t, root, claims) = lab_claim_with(|h| {
                h.add(
                    &DevSpec::new("00:07.0", 0x8086, 0x10d3, 0x020000)
                        .group(6)
                        .driver("e1000e"),
                )
                .unwrap();
            });
            let host = HostRoot::new(&root);
            let before = state(&root);
            // A human's bind of 00:07.0 dies after its first write.
            let crashing = crate::testkit::Failpoints::new(FakeHost::new(host.clone())).panic_after(1);
            let req = crate::bind::BindRequest {
                addresses: vec!["0000:00:07.0".parse().unwrap()],
                only: false,
                driver: None,
            };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::bind::apply::bind(&crashing, &req, false, false, &|_| {})
            }));
            assert!(r.is_err(), "the bind did not crash");
            let bind_state = state(&root);
            let crashing = crate::testkit::Failpoints::new(FakeHost::new(host.clone())).panic_after(n);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                engine(&crashing, &claims).prepare(&gpu_claim())
            }));
            assert!(r.is_err(), "write {n}: no crash");
            assert_eq!(crate::change::journal::read(&host).unwrap().open.len(), 2);
            let ops = FakeHost::new(host.clone());
            let mut e = engine(&ops, &claims);
            let lines = e.cleanup_at_start();
            assert!(
                lines[0].contains("interrupted before this start was undone"),
                "{lines:?}"
            );
            assert!(lines.iter().any(|l| l.contains("for dra-claim:u1")), "{lines:?}");
            assert_eq!(
                state(&root),
                bind_state,
                "write {n}: the host as before the Prepare"
            );
            let open = crate::change::journal::read(&host).unwrap().open;
            assert_eq!(open.len(), 1, "write {n}");
            assert_eq!(open[0].owner, None, "write {n}: the bind's plan stays");
            // The kubelet's retry is not refused: the claim's functions have no open plan.
            e.prepare(&gpu_claim()).unwrap();
            assert_eq!(driver_of(&root, "0000:00:05.0").as_deref(), Some("vfio-pci"));
            e.unprepare("u1").unwrap();
            // `gpupass recover` then takes the bind's plan back.
            crate::change::recover(&ops, false, false).unwrap();
            assert_eq!(state(&root), before, "write {n}");
        }
    }

    /// The lab's mtty parent (types mtty-1 with 2 instances, mtty-2 with 1) beside the lab's
    /// group, and the claim default/tty (UID m1) allocated slot `mdev-mtty-mtty-2-0`.
    fn mtty_claim() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let (t, root, claims) = lab_claim_with(|h| {
            h.virtual_mdev_parent(
                "mtty",
                "mtty",
                &[
                    ("mtty-1", "Single port serial", None, 2, "vfio-pci"),
                    ("mtty-2", "Dual port serial", None, 1, "vfio-pci"),
                ],
            )
            .unwrap();
        });
        let c = serde_json::json!({
            "metadata": {"name": "tty", "namespace": "default", "uid": "m1"},
            "status": {"allocation": {
                "devices": {"results": [{"request": "serial", "driver": DRIVER, "pool": "node-a", "device": "mdev-mtty-mtty-2-0"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}
            }}
        });
        std::fs::write(claims.join("default/tty.json"), c.to_string()).unwrap();
        (t, root, claims)
    }

    fn tty_claim() -> ClaimRef {
        ClaimRef {
            namespace: "default".into(),
            uid: "m1".into(),
            name: "tty".into(),
        }
    }

    /// An mdev slot's Prepare creates one instance of the slot's type through the engine (one
    /// plan owned by the claim, UUID saved in the checkpoint first), hands the container the
    /// instance's VFIO nodes and KubeVirt its `mdevUUID` (no `pciBusID`), leaves the node's
    /// pool as published, writes nothing on a retry, and Unprepare removes the instance and
    /// the files.
    #[test]
    fn an_mdev_slot_is_created_for_its_claim_and_removed_after() {
        let (_t, root, claims) = mtty_claim();
        let host = HostRoot::new(&root);
        let ops = FakeHost::new(host.clone());
        let mut e = engine(&ops, &claims);
        let inv0 = crate::inventory::scan(&host).unwrap();
        let pool0 = super::super::slices::pool(&inv0);
        let names: Vec<&str> = pool0.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "pci-0000-00-05-0",
                "mdev-mtty-mtty-1-0",
                "mdev-mtty-mtty-1-1",
                "mdev-mtty-mtty-2-0"
            ]
        );
        let devs = e.prepare(&tty_claim()).unwrap();
        assert_eq!(devs.len(), 1);
        assert_eq!(devs[0].device, "mdev-mtty-mtty-2-0");
        let entry = e.checkpoint().claims["m1"].clone();
        let uuid = entry.devices[0].mdev.as_ref().unwrap().uuid.clone();
        assert!(crate::model::is_uuid(&uuid), "{uuid}");
        let inv = crate::inventory::scan(&host).unwrap();
        let inst = inv.mdev(&uuid).expect("the instance exists");
        assert_eq!(inst.type_id.as_deref(), Some("mtty-2"));
        let g = inst.iommu_group.unwrap();
        // The group device was not touched.
        assert_eq!(driver_of(&root, "0000:00:05.0").as_deref(), Some("bochs-drm"));
        let spec = std::fs::read_to_string(root.join("var/run/cdi/vfio.gpupass.dev_claim_m1.json")).unwrap();
        assert!(spec.contains("\"/dev/vfio/vfio\""), "{spec}");
        assert!(spec.contains(&format!("\"/dev/vfio/{g}\"")), "{spec}");
        assert!(
            spec.contains(&format!("GPUPASS_DRA_MDEV_MTTY_MTTY_2_0={uuid}")),
            "{spec}"
        );
        let meta = std::fs::read_to_string(root.join(format!(
            "var/lib/kubelet/plugins/{DRIVER}/dra-device-metadata/default_tty/serial/metadata.json"
        )))
        .unwrap();
        for line in meta.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let a = &v["requests"][0]["devices"][0]["attributes"];
            assert_eq!(a["mdevUUID"]["string"], uuid.as_str(), "{line}");
            assert_eq!(a["gpupass.dev/mdevType"]["string"], "mtty-2", "{line}");
            assert!(a.get("resource.kubernetes.io/pciBusID").is_none(), "{line}");
        }
        // The scheduler allocated from the pool as it was: the claim's own instance does not
        // shrink it.
        assert_eq!(super::super::slices::pool(&e.as_offered(&inv)), pool0);
        // The slot is healthy while its instance lives.
        let h = e.health(&inv);
        let slot = h.iter().find(|x| x.device == "mdev-mtty-mtty-2-0").unwrap();
        assert!(slot.healthy, "{slot:?}");
        // A retry answers from the checkpoint.
        let writes = crate::testkit::Failpoints::new(FakeHost::new(host.clone()));
        let mut again = engine(&writes, &claims);
        assert_eq!(again.prepare(&tty_claim()).unwrap(), devs);
        assert_eq!(writes.writes(), 0);
        e.unprepare("m1").unwrap();
        let after = crate::inventory::scan(&host).unwrap();
        assert!(after.mdev(&uuid).is_none());
        assert_eq!(super::super::slices::pool(&after), pool0);
        assert!(!root.join("var/run/cdi/vfio.gpupass.dev_claim_m1.json").exists());
        assert!(!root
            .join(format!(
                "var/lib/kubelet/plugins/{DRIVER}/dra-device-metadata/default_tty"
            ))
            .exists());
        assert!(crate::change::journal::read(&host).unwrap().open.is_empty());
    }

    /// A slot whose type filled up behind the scheduler's back (another user took the last
    /// instance) fails its Prepare with the kernel's count, before any write; a slot name that
    /// is not offered is refused as unknown; and a Prepare killed after each write of its plan
    /// is undone at the next start, the kubelet's retry then preparing it with the UUID the
    /// checkpoint kept.
    #[test]
    fn a_full_type_is_refused_and_a_crashed_mdev_prepare_is_undone_then_retried() {
        let (_t, root, claims) = mtty_claim();
        let host = HostRoot::new(&root);
        let ops = FakeHost::new(host.clone());
        std::fs::write(
            root.join("sys/devices/virtual/mtty/mtty/mdev_supported_types/mtty-2/available_instances"),
            "0\n",
        )
        .unwrap();
        let mut e = engine(&ops, &claims);
        let err = crate::model::ErrorChain(&e.prepare(&tty_claim()).unwrap_err()).to_string();
        // The slot is not offered any more (its type has none available).
        assert!(
            err.contains("mdev-mtty-mtty-2-0") && err.contains("not a device this node offers"),
            "{err}"
        );
        assert!(e.checkpoint().claims.is_empty());
        std::fs::write(
            root.join("sys/devices/virtual/mtty/mtty/mdev_supported_types/mtty-2/available_instances"),
            "1\n",
        )
        .unwrap();
        // Count the plan's writes: create, then the files.
        let counting = crate::testkit::Failpoints::new(FakeHost::new(host.clone()));
        engine(&counting, &claims).prepare(&tty_claim()).unwrap();
        let n_writes = counting.writes();
        assert!(n_writes >= 4, "{n_writes}");
        engine(&ops, &claims).unprepare("m1").unwrap();
        let clean = crate::inventory::scan(&host).unwrap();
        assert!(clean.mdevs.is_empty());
        for n in 1..=n_writes {
            let crashing = crate::testkit::Failpoints::new(FakeHost::new(host.clone())).panic_after(n);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                engine(&crashing, &claims).prepare(&tty_claim())
            }));
            assert!(r.is_err(), "write {n}: no crash");
            let mut e = engine(&ops, &claims);
            let kept = e.checkpoint().claims["m1"].devices[0].mdev.clone().unwrap().uuid;
            let lines = e.cleanup_at_start();
            assert!(
                lines.iter().any(|l| l.contains("for dra-claim:m1")),
                "write {n}: {lines:?}"
            );
            let now = crate::inventory::scan(&host).unwrap();
            assert!(now.mdevs.is_empty(), "write {n}: the instance was undone");
            assert!(
                crate::change::journal::read(&host).unwrap().open.is_empty(),
                "write {n}"
            );
            e.prepare(&tty_claim()).unwrap();
            let uuid = e.checkpoint().claims["m1"].devices[0].mdev.clone().unwrap().uuid;
            assert_eq!(uuid, kept, "write {n}: the retry kept the UUID");
            assert!(crate::inventory::scan(&host).unwrap().mdev(&uuid).is_some());
            e.unprepare("m1").unwrap();
            assert!(
                crate::inventory::scan(&host).unwrap().mdevs.is_empty(),
                "write {n}"
            );
        }
    }

    /// A device held by a host process fails the Prepare at once, naming the holder, with
    /// nothing changed and nothing held in the checkpoint (the kubelet retries); another
    /// gpupass holding the lock fails it after the engine's bounded wait, not GPUPASS_LOCK_TIMEOUT's
    /// 30 s, and a call's deadline shortens that wait.
    #[test]
    fn a_device_in_use_or_a_held_lock_fails_fast_naming_why() {
        let (_t, root, claims) = lab_claim_with(|h| {
            h.drm_node(&"0000:00:05.0".parse().unwrap(), "card0").unwrap();
            h.open_fd(4321, "Xorg", 7, "/dev/dri/card0").unwrap();
        });
        let host = HostRoot::new(&root);
        let before = state(&root);
        let ops = FakeHost::new(host.clone());
        let mut e = engine(&ops, &claims);
        let t0 = Instant::now();
        let err = crate::model::ErrorChain(&e.prepare(&gpu_claim()).unwrap_err()).to_string();
        assert!(err.contains("is open by pid 4321 (Xorg)"), "{err}");
        assert!(
            err.starts_with("claim default/gpu (u1): prepare failed: "),
            "{err}"
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert_eq!(state(&root), before);
        assert!(e.checkpoint().claims.is_empty());
        std::fs::remove_dir_all(root.join("proc/4321")).unwrap();

        // Another gpupass holds the lock.
        let held = crate::change::journal::lock(&host, Duration::ZERO).unwrap();
        let mut e = engine(&ops, &claims).with_lock_wait(Duration::from_millis(300));
        let t0 = Instant::now();
        let err = crate::model::ErrorChain(&e.prepare(&gpu_claim()).unwrap_err()).to_string();
        assert!(err.contains("did not finish within 0.3 s"), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(e.checkpoint().claims.is_empty());
        // A deadline sooner than the wait shortens it; one already past tries once.
        let e = e.with_lock_wait(Duration::from_secs(30));
        let soon = e.wait_for(Some(Instant::now() + Duration::from_secs(2)));
        assert!(
            soon <= Duration::from_millis(1500) && soon > Duration::from_millis(1000),
            "{soon:?}"
        );
        assert_eq!(e.wait_for(Some(Instant::now())), Duration::ZERO);
        assert_eq!(e.wait_for(None), Duration::from_secs(30));
        let mut e = e;
        let t0 = Instant::now();
        let err = e
            .prepare_until(&gpu_claim(), Some(Instant::now() + Duration::from_millis(700)))
            .unwrap_err();
        assert!(
            crate::model::ErrorChain(&err)
                .to_string()
                .contains("did not finish within 0"),
            "{err}"
        );
        assert!(t0.elapsed() < Duration::from_millis(1500), "{:?}", t0.elapsed());
        drop(held);
        assert_eq!(state(&root), before);
        e.prepare(&gpu_claim()).unwrap();
        assert_eq!(driver_of(&root, "0000:00:05.0").as_deref(), Some("vfio-pci"));
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
        let mut e = kit(Driver::new(&ops, me, Policy::Auto, "b1".into()).unwrap(), &claims);
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
        let source = t.path().join("claims");
        let mut restarted = kit(
            Driver::new(&ops, e.me.clone(), Policy::Auto, "b1".into()).unwrap(),
            &source,
        );
        assert_eq!(
            restarted.cleanup_at_start(),
            ["claim default/gpu (u1) deleted: unprepared"]
        );
        assert_eq!(driver_of(&root, "0000:03:00.0").as_deref(), Some("nvidia"));
        assert!(restarted.checkpoint().claims.is_empty());

        // A claim of an earlier boot: at start its files go, its functions are not touched.
        std::fs::write(&claim_file, text).unwrap();
        restarted.prepare(&r).unwrap();
        let mut after_reboot = kit(
            Driver::new(&ops, e.me.clone(), Policy::Auto, "b2".into()).unwrap(),
            &source,
        );
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

    /// Binding conditions (super::binding): the group that needs a switch is published with
    /// them (a group on vfio-pci already is not, and a group a claim moved keeps them); a
    /// member held by a host process fails the bind before binding as `InUse`, naming the
    /// holder, changing nothing; without the holder the group is bound (no files) and recorded
    /// `bound` with the drivers before; a second bind changes nothing; Prepare then finds the
    /// group bound and writes only the files, Unprepare gives it back; a claim bound before
    /// binding and then gone is given back by the plugin, a prepared one is not.
    #[test]
    fn a_group_bound_before_binding_is_taken_over_by_prepare_or_given_back() {
        use crate::containers::kubelet::binding::DeviceKey;
        let (_t, root, claims) = lab_claim_with(|h| {
            h.drm_node(&"0000:00:05.0".parse().unwrap(), "card0").unwrap();
            h.open_fd(4321, "Xorg", 7, "/dev/dri/card0").unwrap();
            h.add(
                &DevSpec::new("00:06.0", 0x1234, 0x11e8, 0x00ff00)
                    .group(5)
                    .driver("vfio-pci"),
            )
            .unwrap();
        });
        let host = HostRoot::new(&root);
        let ops = FakeHost::new(host.clone());
        let mut e = engine(&ops, &claims);
        e.binding_conditions = true;
        type Conds = (Option<Vec<String>>, Option<Vec<String>>);
        let conds = |e: &mut Kit<'_>| -> BTreeMap<String, Conds> {
            e.resources()
                .unwrap()
                .pool
                .devices
                .into_iter()
                .map(|d| (d.name, (d.binding_conditions, d.binding_failure_conditions)))
                .collect()
        };
        let marked = (
            Some(vec![super::super::binding::READY.to_string()]),
            Some(vec![super::super::binding::FAILED.to_string()]),
        );
        let c = conds(&mut e);
        assert_eq!(c["pci-0000-00-05-0"], marked);
        assert_eq!(
            c["pci-0000-00-06-0"],
            (None, None),
            "on vfio-pci already: no switch"
        );
        let keys = [DeviceKey {
            request: "vfio".into(),
            pool: "node-a".into(),
            device: "pci-0000-00-05-0".into(),
        }];
        let claim = fetch(&e.src, &gpu_claim()).unwrap();
        let before = state(&root);

        let f = e.bind_early(&claim, &keys).unwrap_err();
        assert_eq!(f.reason, "InUse", "{f:?}");
        assert!(f.message.contains("is open by pid 4321 (Xorg)"), "{}", f.message);
        assert_eq!(state(&root), before);
        assert!(e.checkpoint().claims.is_empty());

        std::fs::remove_dir_all(root.join("proc/4321")).unwrap();
        let msg = e.bind_early(&claim, &keys).unwrap();
        assert!(msg.contains("IOMMU group 4 on vfio-pci"), "{msg}");
        assert_eq!(driver_of(&root, "0000:00:05.0").as_deref(), Some("vfio-pci"));
        assert_eq!(driver_of(&root, "0000:00:05.1").as_deref(), Some("vfio-pci"));
        let entry = &e.checkpoint().claims["u1"];
        assert_eq!(entry.state, State::Bound);
        assert_eq!(
            entry.drivers_before.values().cloned().collect::<Vec<_>>(),
            [Some("bochs-drm".to_string()), Some("snd_hda_intel".to_string())]
        );
        assert!(
            !state(&root).keys().any(|k| k.starts_with("var/")),
            "no files before Prepare"
        );
        assert_eq!(
            conds(&mut e)["pci-0000-00-05-0"],
            marked,
            "published as before the bind"
        );
        let j = journal(&root);
        assert!(e.bind_early(&claim, &keys).unwrap().contains("already"));
        assert_eq!(journal(&root), j, "a second bind writes nothing");

        // Prepare takes it over: no bind, only the files; Unprepare gives the group back.
        e.prepare(&gpu_claim()).unwrap();
        assert_eq!(e.checkpoint().claims["u1"].state, State::Completed);
        assert_eq!(
            e.checkpoint().claims["u1"].drivers_before[&"0000:00:05.0".parse::<PciAddress>().unwrap()]
                .as_deref(),
            Some("bochs-drm")
        );
        assert!(state(&root).keys().any(|k| k.starts_with("var/run/cdi")));
        assert!(
            e.release_early(&|_| true).is_empty(),
            "a prepared claim is the kubelet's"
        );
        e.unprepare("u1").unwrap();
        assert_eq!(state(&root), before);

        // Bound before binding, then deallocated: the plugin gives it back.
        e.bind_early(&claim, &keys).unwrap();
        assert!(e.release_early(&|c| c.uid != "u1").is_empty());
        let lines = e.release_early(&|c| c.uid == "u1");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("given back"), "{lines:?}");
        assert_eq!(state(&root), before);
        assert!(e.checkpoint().claims.is_empty());
    }
}
