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
pub(crate) const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(3);

/// Kept from the kubelet's deadline for the work after the lock (the scans, the writes, the
/// reply).
pub(crate) const DEADLINE_MARGIN: Duration = Duration::from_millis(500);

/// Why Prepare or Unprepare failed: the message kubelet puts in the Pod's events.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PrepareError {
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
pub(crate) struct Driver<'a> {
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
    /// Devices whose bind before binding failed because a host process holds them (`InUse`),
    /// with what holds them: published with the [`BUSY_KEY`] taint until the in-use check finds
    /// them free ([`Driver::recheck_busy`]), so the scheduler sends the Pod elsewhere instead
    /// of choosing the same device again.
    pub(super) busy: BTreeMap<String, String>,
    /// The host as this driver's last change left it ([`apply::Applied::view`]: read once
    /// under the lock after the writes, the view the claim's files and the CDI refresh were
    /// planned from): what the next [`Driver::resources`] takes instead of a scan of its own
    /// (the kit asks for the resources right after each call). Cleared when a call begins, so
    /// a call that fails or reads nothing after its writes leaves the next refresh to scan.
    pub(super) after: Option<Inventory>,
    /// The host as the last [`Driver::resources`] read it (its slices and health were made
    /// from it): the view the next call checks its claim against ([`Driver::view`]).
    pub(super) published: Option<Inventory>,
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
    pub(crate) fn new(
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
            busy: BTreeMap::new(),
            after: None,
            published: None,
            lock_wait: DEFAULT_LOCK_WAIT,
            binding_conditions: false,
        })
    }

    /// Wait at most `wait` for the engine's lock.
    #[cfg(test)]
    pub(crate) fn with_lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    /// The lock wait of a call due by `deadline`: [`Driver::lock_wait`], or what is left of
    /// the deadline less [`DEADLINE_MARGIN`] when that is shorter (none left: one try).
    pub(crate) fn wait_for(&self, deadline: Option<Instant>) -> Duration {
        match deadline {
            Some(d) => self.lock_wait.min(
                d.saturating_duration_since(Instant::now())
                    .saturating_sub(DEADLINE_MARGIN),
            ),
            None => self.lock_wait,
        }
    }

    #[cfg(test)]
    pub(crate) fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    pub(super) fn save(&self) -> Result<(), PrepareError> {
        Ok(checkpoint::save(&self.checkpoint_path, &self.checkpoint)?)
    }

    pub(super) fn scan(&self) -> Result<Inventory, PrepareError> {
        Ok(crate::inventory::scan(self.ops.root())?)
    }

    /// The host a claim is checked against before its lock is taken, without reading the
    /// whole host again: the view the last call's writes left ([`Driver::after`]), else the
    /// one the slices were last published from ([`Driver::published`], which is what the
    /// scheduler allocated from), else a scan. Taken: the call hands a view on when it ends.
    /// Nothing is decided on it alone: under the lock the engine plans the bind from the
    /// groups as they are then, re-checks them before its writes, and records the drivers it
    /// moved from ([`Driver::settle_before`]).
    pub(super) fn view(&mut self) -> Result<Inventory, PrepareError> {
        match self.after.take().or_else(|| self.published.take()) {
            Some(inv) => Ok(inv),
            None => self.scan(),
        }
    }

    /// The devices of a claim prepared in this boot, as its Prepare returned them: what a
    /// retry returns without reading the claim or touching the host.
    pub(crate) fn prepared(&self, c: &ClaimRef) -> Option<Vec<PreparedDevice>> {
        let e = self.checkpoint.claims.get(&c.uid)?;
        if e.boot_id == self.boot_id && e.state == State::Completed {
            return e.prepared.as_ref().map(|p| p.devices.clone());
        }
        None
    }

    /// [`Driver::prepare_until`] without a deadline.
    #[cfg(test)]
    pub(crate) fn prepare(&mut self, c: &Claim) -> Result<Vec<PreparedDevice>, PrepareError> {
        self.prepare_until(c, None)
    }

    /// NodePrepareResources for one claim (read by the kit), due by `deadline` (the gRPC
    /// call's). Idempotent: a claim prepared in this boot returns what it returned before
    /// without touching the host; one whose Prepare was interrupted is prepared again (the
    /// bind is idempotent) keeping the drivers of the first attempt. The host changes are one
    /// plan owned by the claim ([`apply::prepare`]): a failure rolls all of it back.
    pub(crate) fn prepare_until(
        &mut self,
        claim: &Claim,
        deadline: Option<Instant>,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let c = &claim.asked;
        if let Some(devices) = self.prepared(c) {
            return Ok(devices);
        }
        let label = format!("{}/{} ({})", c.namespace, c.name, c.uid);
        let inv = self.view()?;
        let checked = match self.check_claim(claim, &inv, &label) {
            Ok(checked) => checked,
            Err(e) => {
                // Refused before anything changed: the view is still the host's.
                self.after = Some(inv);
                return Err(e);
            }
        };
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
        let done = match r {
            Ok(done) => done,
            Err(e) => {
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
        };
        let prepared = prepared.expect("the engine planned the claim's files");
        let devices = prepared.devices.clone();
        self.settle_before(&c.uid, &earlier, &done.moved);
        self.after = done.view;
        if let Some(e) = self.checkpoint.claims.get_mut(&c.uid) {
            e.state = State::Completed;
            e.prepared = Some(prepared);
        }
        self.save()?;
        Ok(devices)
    }

    /// A claim's checks against the host as `inv` has it, before anything changes: the claim
    /// itself ([`claim::check`] against what this node offers), its backend and KVM, its
    /// mdev slots' instances, and no other claim of this boot holding its devices.
    pub(super) fn check_claim(
        &self,
        claim: &Claim,
        inv: &Inventory,
        label: &str,
    ) -> Result<claim::Checked, PrepareError> {
        let c = &claim.asked;
        let offered = claim::Offered::of(&self.as_offered(inv));
        let mut checked = claim::check(c, &claim.object, &self.me, &offered, self.default)?;
        claim::precheck_backend(inv, &checked)?;
        claim::precheck_kvm(self.ops.root(), &checked)?;
        self.choose_mdevs(inv, label, &mut checked)?;
        for d in &checked.devices {
            if let Some(h) = self.checkpoint.holder(&d.device, &c.uid, &self.boot_id) {
                return Err(PrepareError::Held {
                    claim: label.to_string(),
                    device: d.device.clone(),
                    holder: format!("{}/{} ({})", h.claim.namespace, h.claim.name, h.claim.uid),
                });
            }
        }
        Ok(checked)
    }

    /// After a claim's plan committed: the drivers this attempt recorded before it had the
    /// lock, from the view its claim check read (`earlier` holds those of an earlier attempt,
    /// kept), are settled against what the plan found under the lock. A function the plan
    /// moved is recorded as on the driver the plan moved it from. A member another gpupass
    /// bound while this attempt waited for the lock (a host `gpupass bind` that won the race)
    /// was not moved by the claim: it is recorded as on the driver it is on now, so Unprepare
    /// leaves it where that bind put it.
    pub(super) fn settle_before(
        &mut self,
        uid: &str,
        earlier: &BTreeMap<PciAddress, Option<String>>,
        moved: &BTreeMap<PciAddress, Option<String>>,
    ) {
        let host = self.ops.root().clone();
        if let Some(e) = self.checkpoint.claims.get_mut(uid) {
            for (a, d) in e.drivers_before.iter_mut() {
                if earlier.contains_key(a) {
                    continue;
                }
                if let Some(from) = moved.get(a) {
                    *d = from.clone();
                    continue;
                }
                let now = crate::change::engine::current_driver(&host, a);
                if now.as_deref().is_some_and(crate::model::is_vfio_driver) {
                    *d = now;
                }
            }
        }
    }

    /// [`Driver::unprepare_until`] without a deadline.
    pub(crate) fn unprepare(&mut self, uid: &str) -> Result<(), PrepareError> {
        self.unprepare_until(uid, None)
    }

    /// NodeUnprepareResources for one claim, due by `deadline`: the undo of its prepare as one
    /// plan owned by the claim ([`apply::unprepare`]): its files removed, the functions it
    /// moved given back to the drivers the journal recorded (only in the boot that moved them;
    /// a function on vfio-pci before gpupass touched it stays there), its entry dropped. A
    /// claim the plugin does not know is done already.
    pub(crate) fn unprepare_until(
        &mut self,
        uid: &str,
        deadline: Option<Instant>,
    ) -> Result<(), PrepareError> {
        let Some(e) = self.checkpoint.claims.get(uid).cloned() else {
            return Ok(());
        };
        self.after = None;
        let label = format!("{}/{} ({})", e.claim.namespace, e.claim.name, e.claim.uid);
        let (moved, mdevs) = if e.boot_id == self.boot_id {
            (e.moved(), mdevs_of(&e.devices))
        } else {
            // The old kernel's binds and mediated devices went with it.
            (Vec::new(), Vec::new())
        };
        let files = files_of(&self.me.driver, &e);
        let done = apply::unprepare(
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
        self.after = done.view;
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
    pub(crate) fn cleanup_at_start(&mut self, claims: &dyn ClaimSource) -> Vec<String> {
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
    pub(crate) fn as_offered(&self, inv: &Inventory) -> Inventory {
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
    pub(crate) fn health(&mut self, inv: &Inventory) -> Vec<Health> {
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

    /// Drops from [`Driver::busy`] each device no host process holds any more (the bind's own
    /// in-use check, [`crate::bind::in_use`], over its members as `inv` has them), and each
    /// device no longer offered. Reads the host's users only while a device is busy.
    pub(super) fn recheck_busy(&mut self, inv: &Inventory) {
        if self.busy.is_empty() {
            return;
        }
        let members: BTreeMap<String, Vec<PciAddress>> = slices::publishable(inv)
            .into_iter()
            .map(|p| (p.name, p.members))
            .collect();
        let root = self.ops.root();
        self.busy.retain(|dev, why| {
            let Some(ms) = members.get(dev) else {
                tracing::info!("{dev} is no longer offered: its busy taint ({why}) goes");
                return false;
            };
            match crate::bind::in_use(root, inv, ms) {
                Some(now) => {
                    *why = now;
                    true
                }
                None => {
                    tracing::info!("{dev} is free again (was: {why}): its busy taint goes");
                    false
                }
            }
        });
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
    /// node offers) and the health of the host as it is: as the last call's writes left it
    /// when that call read it after them ([`Driver::after`], taken once), else scanned now.
    fn resources(&mut self) -> Result<Resources, PrepareError> {
        let inv = match self.after.take() {
            Some(inv) => inv,
            None => self.scan()?,
        };
        let health = self.health(&inv);
        self.recheck_busy(&inv);
        let offered = self.as_offered(&inv);
        let mut pool = slices::pool(&offered);
        if self.binding_conditions {
            slices::mark(&mut pool, &offered);
        }
        self.published = Some(inv);
        Ok(Resources {
            // An unhealthy device is tainted (NoSchedule): the scheduler gives it only to a
            // claim that tolerates the taint, which Prepare then serves like any other. A busy
            // one too, with its own key.
            pool: tainted(pool, &self.unhealthy, &self.busy),
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
pub(crate) fn health(
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
pub(crate) const TAINT_KEY: &str = "gpupass.dev/unhealthy";

/// The effect of that taint: NoSchedule (docs/dra.md, "Taints": new claims do not get the
/// device; a Pod that has it keeps running, and its status says Unhealthy).
pub(crate) const TAINT_EFFECT: &str = "NoSchedule";

/// The key of the taint a busy device is published with: its bind before binding failed
/// because a host process holds it (value [`BUSY_VALUE`], effect [`TAINT_EFFECT`]). The device
/// is not sick, so it is not Unhealthy; the taint goes when the in-use check finds it free.
pub(crate) const BUSY_KEY: &str = "gpupass.dev/busy";

/// The busy taint's value: the failure condition's reason ([`super::binding::reason`]).
pub(crate) const BUSY_VALUE: &str = "InUse";

/// `pool` with a [`TAINT_KEY`] taint on each device `unhealthy` names (device name → code) and a
/// [`BUSY_KEY`] taint on each device `busy` names.
pub(crate) fn tainted(
    mut pool: Pool,
    unhealthy: &BTreeMap<String, &'static str>,
    busy: &BTreeMap<String, String>,
) -> Pool {
    for d in &mut pool.devices {
        if let Some(code) = unhealthy.get(&d.name) {
            d.taints.get_or_insert_with(Vec::new).push(DeviceTaint {
                key: TAINT_KEY.into(),
                value: Some((*code).into()),
                effect: TAINT_EFFECT.into(),
                time_added: None,
            });
        }
        if busy.contains_key(&d.name) {
            d.taints.get_or_insert_with(Vec::new).push(DeviceTaint {
                key: BUSY_KEY.into(),
                value: Some(BUSY_VALUE.into()),
                effect: TAINT_EFFECT.into(),
                time_added: None,
            });
        }
    }
    pool
}

#[cfg(test)]
mod tests;
