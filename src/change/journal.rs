//! The one journal and the one lock of every change gpupass makes to a host.
//!
//! `run/gpupass/journal.jsonl` is append-only JSON lines, each written with one `write(2)` before
//! the change it announces is made; the `change` (and `extend`) record and the one that ends a
//! transaction are `fdatasync`ed too ([`Journal::append`]):
//!
//! ```text
//! {"v":1,"op":"change","txn":"4242-1732871234123","time":1732871234,"pid":4242,"domain":"bind",
//!  "what":"bind of IOMMU group 1","changes":[{"kind":"function","action":"bind",
//!  "address":"0000:01:00.1","group":1,
//!  "before":{"driver":"snd_hda_intel","module":"snd_hda_intel","driver_override":null},
//!  "after":{"driver":"vfio-pci","module":"vfio_pci","driver_override":"vfio-pci"}}, ...],"writes":6}
//! {"v":1,"op":"step","txn":"4242-...","n":1,"path":"/sys/bus/pci/devices/0000:01:00.1/driver_override","value":"vfio-pci"}
//! ...
//! {"v":1,"op":"commit","txn":"4242-..."}
//! ```
//!
//! One `change` record opens every transaction, whatever it changes: `changes` holds the
//! plan's [`Object`]s (functions, mdev instances, vGPU types, files) with their state before
//! and after, `owner` the plan's owner when it has one (a DRA claim UID). A transaction ends
//! with `commit`, `rolled_back` (a failure undone) or `recovered` (`gpupass recover` restored
//! `before`, or with `--continue` reached `after`). An `extend` record adds a part to an open
//! transaction, planned after its earlier writes (the DRA plugin's claim files, whose VFIO
//! nodes exist once the bind is done), journaled before its first write. A `change` without an end is an unfinished
//! plan: the process died between two writes. Replaying the committed transactions gives the
//! functions gpupass has bound and the driver each had before, which `unbind` restores. The
//! journal lives under `/run` (tmpfs) on purpose: after a reboot the kernel's driver state is
//! fresh and so is the journal. (A `begin` record is the bind-only header older gpupass
//! versions wrote; it is still read.)
//!
//! `run/gpupass/lock` is `flock`ed exclusively by every command that changes the host, from
//! before it reads the host until its journal entry is closed, so two gpupass processes never
//! plan from the same stale view or interleave writes.

use super::{Action, BoundState, ChangeError, DriverState, FuncPlan, Holds, Object};
use crate::host::HostRoot;
use crate::messages;
use crate::model::{is_vfio_driver, PciAddress};
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const VERSION: u32 = 1;

/// One journal line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Record {
    /// The bind/unbind header of older versions (read, never written now).
    Begin {
        txn: String,
        time: u64,
        pid: u32,
        action: Action,
        groups: Vec<u32>,
        functions: Vec<FuncPlan>,
        writes: usize,
    },
    /// Written *before* write number `n` (1-based) of the transaction.
    Step {
        txn: String,
        n: usize,
        path: String,
        value: String,
    },
    /// Written before each write that undoes (rollback) or repairs (recover) a transaction.
    Undo {
        txn: String,
        path: String,
        value: String,
    },
    Commit {
        txn: String,
    },
    RolledBack {
        txn: String,
        error: String,
    },
    Recovered {
        txn: String,
        /// `before` (restored) or `after` (completed with --continue).
        to: String,
    },
    /// The plan of a change: `domain` names who made it (`bind`, `mdev`, `persist`, `cdi`,
    /// joined with `+` for a plan of several parts), `what` describes it for people,
    /// `owner` is the plan's owner when it has one, `changes` the plan's [`Object`]s with
    /// their state before and after (what `recover` restores or completes), `writes` the
    /// number of `step`s the plan makes.
    Change {
        txn: String,
        time: u64,
        pid: u32,
        domain: String,
        what: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
        changes: serde_json::Value,
        writes: usize,
        /// What `owner` holds once the plan commits ([`Holds`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        holds: Option<Holds>,
        /// `owner` gives back what it held once the plan commits.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        releases: bool,
    },
    /// More of transaction `txn`'s plan: a part planned after the plan's earlier writes
    /// (`change::Session::apply_then`), its objects (`changes`) and its `writes`, journaled
    /// before its first write; replay adds them to the open plan, so `recover` undoes or
    /// finishes the whole of it.
    Extend {
        txn: String,
        domain: String,
        what: String,
        changes: serde_json::Value,
        writes: usize,
    },
    /// Compacted journal: the functions bound by gpupass and their previous state, and what
    /// live owners hold.
    State {
        bound: Vec<(PciAddress, DriverState)>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        held: Vec<(String, Vec<Holder>)>,
    },
}

#[derive(Serialize, Deserialize)]
struct Line {
    v: u32,
    #[serde(flatten)]
    rec: Record,
}

/// A plan that began and never ended.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenChange {
    pub txn: String,
    pub pid: u32,
    pub domain: String,
    pub what: String,
    pub owner: Option<String>,
    /// The plan's objects (`changes`), as the journal holds them.
    pub changes: serde_json::Value,
    pub writes: usize,
    /// Last write announced (0: none); it may or may not have happened.
    pub at: usize,
    pub at_path: Option<String>,
    pub holds: Option<Holds>,
    pub releases: bool,
}

/// One holder of a key ([`Holds`]): the owner tag (`dra-claim:UID`), its label for people,
/// and whether it shares the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub owner: String,
    pub label: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
}

/// Who holds what: key (an address or an mdev parent) -> its holders.
pub type Held = std::collections::BTreeMap<String, Vec<Holder>>;

impl OpenChange {
    pub(crate) fn describe(&self) -> String {
        format!(
            "{}{} (txn {}, pid {}) stopped at write {} of {}{}",
            self.what,
            // The plan's `what` names its owner already (Plan::describe); older journals'
            // do not.
            self.owner
                .as_ref()
                .filter(|o| !self.what.contains(&format!("(for {o})")))
                .map(|o| format!(" for {o}"))
                .unwrap_or_default(),
            self.txn,
            self.pid,
            self.at,
            self.writes,
            self.at_path
                .as_ref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default()
        )
    }

    /// The plan's objects; `None` when the journal holds kinds this version does not know.
    pub(crate) fn objects(&self) -> Option<Vec<Object>> {
        serde_json::from_value(self.changes.clone()).ok()
    }

    /// The plan's objects' keys ([`Object::keys`]).
    pub(crate) fn keys(&self) -> Vec<String> {
        self.objects()
            .unwrap_or_default()
            .iter()
            .flat_map(Object::keys)
            .collect()
    }
}

/// What the journal says.
#[derive(Debug, Clone, Default)]
pub struct Replay {
    pub bound: BoundState,
    /// What live owners hold (their committed [`Holds`], until a plan of theirs releases).
    pub held: Held,
    /// Unfinished plans, oldest first.
    pub open: Vec<OpenChange>,
    /// Lines that could not be parsed (a torn last line after a crash mid-append).
    pub bad_lines: usize,
    /// Lines that were parsed.
    pub records: usize,
}

pub(crate) fn journal_path(host: &HostRoot) -> PathBuf {
    host.run_gpupass().join("journal.jsonl")
}

pub(crate) fn lock_path(host: &HostRoot) -> PathBuf {
    host.run_gpupass().join("lock")
}

fn jerr(path: &Path, host: &HostRoot) -> impl Fn(io::Error) -> ChangeError {
    let p = PathBuf::from(host.display(path));
    move |source| ChangeError::Journal {
        path: p.clone(),
        source,
    }
}

/// Replay the journal (a missing journal is an empty one).
pub(crate) fn read(host: &HostRoot) -> Result<Replay, ChangeError> {
    let path = journal_path(host);
    let text = match crate::host::read_bounded(&path, 64 << 20) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Replay::default()),
        Err(e) => return Err(jerr(&path, host)(e)),
    };
    Ok(replay(&text))
}

/// Replay journal text.
pub fn replay(text: &str) -> Replay {
    let mut r = Replay::default();
    for line in text.lines() {
        r.feed(line);
    }
    r
}

impl Replay {
    /// Replay one more journal line on top of what was replayed so far (what [`replay`] does
    /// for each line, and what a session does with the lines it appended itself, instead of
    /// reading the journal again).
    pub(crate) fn feed(&mut self, line: &str) {
        let r = self;
        if line.trim().is_empty() {
            return;
        }
        let rec = match serde_json::from_str::<Line>(line) {
            Ok(l) if l.v <= VERSION => {
                r.records += 1;
                l.rec
            }
            _ => {
                r.bad_lines += 1;
                return;
            }
        };
        let open = &mut r.open;
        match rec {
            Record::Begin {
                txn,
                pid,
                action,
                groups,
                functions,
                writes,
                ..
            } => {
                let objects: Vec<Object> = functions.iter().map(|f| Object::function(action, f)).collect();
                let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
                open.push(OpenChange {
                    txn,
                    pid,
                    domain: action.to_string(),
                    what: format!("{action} of IOMMU group {}", groups.join(", ")),
                    owner: None,
                    changes: serde_json::to_value(objects).unwrap_or_default(),
                    writes,
                    at: 0,
                    at_path: None,
                    holds: None,
                    releases: false,
                })
            }
            Record::Change {
                txn,
                pid,
                domain,
                what,
                owner,
                changes,
                writes,
                holds,
                releases,
                ..
            } => open.push(OpenChange {
                txn,
                pid,
                domain,
                what,
                owner,
                changes,
                writes,
                at: 0,
                at_path: None,
                holds,
                releases,
            }),
            Record::Step { txn, n, path, .. } => {
                if let Some(t) = open.iter_mut().find(|t| t.txn == txn) {
                    t.at = n;
                    t.at_path = Some(path);
                }
            }
            Record::Extend {
                txn,
                domain,
                what,
                changes,
                writes,
            } => {
                if let Some(t) = open.iter_mut().find(|t| t.txn == txn) {
                    if let (Some(all), serde_json::Value::Array(more)) = (t.changes.as_array_mut(), changes) {
                        all.extend(more);
                    }
                    if t.domain.is_empty() {
                        t.domain = domain;
                    } else if !t.domain.split('+').any(|d| d == domain) {
                        t.domain = format!("{}+{domain}", t.domain);
                    }
                    t.what = if t.what.is_empty() {
                        what
                    } else {
                        format!("{} + {what}", t.what)
                    };
                    t.writes += writes;
                }
            }
            Record::Undo { .. } => {}
            Record::Commit { txn } => {
                if let Some(i) = open.iter().position(|t| t.txn == txn) {
                    let t = open.remove(i);
                    settle(&mut r.bound, &t);
                    settle_holds(&mut r.held, &t);
                }
            }
            Record::RolledBack { txn, .. } => {
                open.retain(|t| t.txn != txn);
            }
            Record::Recovered { txn, to } => {
                if let Some(i) = open.iter().position(|t| t.txn == txn) {
                    let t = open.remove(i);
                    if to == "after" {
                        settle(&mut r.bound, &t);
                        settle_holds(&mut r.held, &t);
                    }
                }
            }
            Record::State { bound, held } => {
                r.bound = bound.into_iter().collect();
                r.held = held.into_iter().collect();
            }
        }
    }
}

/// Apply a completed transaction's holds: an owner's release drops every key it held; its
/// [`Holds`] replace what it held before.
fn settle_holds(held: &mut Held, t: &OpenChange) {
    let Some(owner) = t.owner.as_deref() else {
        return;
    };
    if t.releases || t.holds.is_some() {
        for hs in held.values_mut() {
            hs.retain(|h| h.owner != owner);
        }
        held.retain(|_, hs| !hs.is_empty());
    }
    let Some(h) = &t.holds else { return };
    let keys = h
        .alone
        .iter()
        .map(|k| (k, false))
        .chain(h.shared.iter().map(|k| (k, true)));
    for (k, shared) in keys {
        held.entry(k.clone()).or_default().push(Holder {
            owner: owner.to_string(),
            label: h.label.clone(),
            shared,
        });
    }
}

impl Replay {
    /// What `owner` holds now, as [`Holds`] keys (alone, shared), each sorted.
    #[cfg(feature = "dra")]
    pub(crate) fn held_by(&self, owner: &str) -> (Vec<String>, Vec<String>) {
        let (mut alone, mut shared) = (Vec::new(), Vec::new());
        for (k, hs) in &self.held {
            for h in hs.iter().filter(|h| h.owner == owner) {
                if h.shared {
                    shared.push(k.clone());
                } else {
                    alone.push(k.clone());
                }
            }
        }
        (alone, shared)
    }

    /// The holders that keep `owner` from holding `alone` (anyone else) and `shared` (anyone
    /// else who holds it alone), each with the key: one owner per group.
    pub(crate) fn holders_against<'r>(
        &'r self,
        owner: Option<&str>,
        alone: &[String],
        shared: &[String],
    ) -> Vec<(String, &'r Holder)> {
        let mut out = Vec::new();
        let keys = alone
            .iter()
            .map(|k| (k, false))
            .chain(shared.iter().map(|k| (k, true)));
        for (k, sharing) in keys {
            for h in self.held.get(k).into_iter().flatten() {
                let other = Some(h.owner.as_str()) != owner;
                let known = out.iter().any(|(_, o): &(String, &Holder)| o.owner == h.owner);
                if other && !(sharing && h.shared) && !known {
                    out.push((k.clone(), h));
                }
            }
        }
        out
    }
}

/// Apply a completed transaction's function moves to the "bound by gpupass" state.
fn settle(bound: &mut BoundState, t: &OpenChange) {
    for o in t.objects().unwrap_or_default() {
        let Object::Function {
            action,
            address,
            before,
            after,
            ..
        } = o
        else {
            continue;
        };
        match action {
            Action::Bind => {
                if after.driver.as_deref().is_some_and(is_vfio_driver) {
                    // Keep the oldest "before": a rebind between VFIO drivers must not make
                    // gpupass forget the native driver.
                    let prev = bound.get(&address).cloned();
                    let keep = match prev {
                        Some(p) if before.driver.as_deref().is_some_and(is_vfio_driver) => p,
                        _ => before.clone(),
                    };
                    bound.insert(address, keep);
                }
            }
            Action::Unbind => {
                bound.remove(&address);
            }
        }
    }
}

/// The exclusive lock; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct Lock {
    _file: File,
}

fn holder(path: &Path) -> String {
    crate::host::read_attr(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

fn open_lock_file(host: &HostRoot) -> Result<File, ChangeError> {
    let path = lock_path(host);
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
    };
    // The directory exists after the first gpupass of a boot: make it only when missing.
    match open() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let dir = host.run_gpupass();
            fs::create_dir_all(&dir).map_err(jerr(&dir, host))?;
            open().map_err(jerr(&path, host))
        }
        r => r.map_err(jerr(&path, host)),
    }
}

fn try_flock(f: &File) -> io::Result<bool> {
    match rustix::fs::flock(f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK || e == rustix::io::Errno::INTR => Ok(false),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// How long to wait for another gpupass: `GPUPASS_LOCK_TIMEOUT` seconds, default 30.
pub(crate) fn lock_timeout() -> Duration {
    let s = std::env::var("GPUPASS_LOCK_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
        .unwrap_or(30.0);
    Duration::from_secs_f64(s.min(86_400.0))
}

/// Take the lock, waiting up to `wait` for another gpupass to finish.
pub fn lock(host: &HostRoot, wait: Duration) -> Result<Lock, ChangeError> {
    // A wrong --root must not get a `run/gpupass` made under it (bad input changes nothing).
    let bus = host.sys_bus_pci_devices();
    if let Err(error) = std::fs::read_dir(&bus) {
        return Err(crate::inventory::InventoryError::NoPciBus {
            path: bus,
            source: error,
        }
        .into());
    }
    let f = open_lock_file(host)?;
    let path = lock_path(host);
    let start = Instant::now();
    let mut told = false;
    loop {
        if try_flock(&f).map_err(jerr(&path, host))? {
            break;
        }
        if start.elapsed() >= wait {
            return Err(ChangeError::Locked {
                path: host.display(&path).into(),
                holder: holder(&path),
                waited: wait,
            });
        }
        if !told {
            messages::line(format_args!(
                "gpupass: waiting for another gpupass (pid {}) to finish changing devices",
                holder(&path)
            ));
            told = true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // Say who holds it, for the message of the one that waits: one write at the start, padded
    // to a fixed width so that it covers any holder's line before it (a pid has at most 7
    // digits; readers trim), instead of a truncate, a seek and a write.
    let _ = write_at_start(&f, format!("{:<10}\n", std::process::id()).as_bytes());
    Ok(Lock { _file: f })
}

fn write_at_start(f: &File, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    f.write_all_at(bytes, 0)
}

/// The open journal, for appending.
pub(crate) struct Journal {
    path: PathBuf,
    /// `path` as the user sees it (without the root).
    display: PathBuf,
    file: File,
    /// The records a compaction left when it was opened (0: truncated, 1: a `state`).
    compacted: Option<usize>,
    /// The lines appended since it was opened, for [`Journal::settle`].
    appended: Vec<String>,
    /// An append failed (the file may end in a torn line): settle by reading it again.
    torn: bool,
}

impl Journal {
    /// Open (create) the journal; call with the lock held and `replay` read under it.
    ///
    /// When nothing is open, finished transactions are folded into one `state` record first:
    /// every gpupass command replays the journal (to notice a plan a crash left open), so its
    /// length is paid on each call. When that state is empty (nothing bound by gpupass, nothing
    /// held: a host where gpupass only makes mdevs, or binds nothing now) the fold is the
    /// empty journal, and the file is truncated as it is opened (one call), not rewritten; an
    /// empty journal and an empty `state` record replay alike. Otherwise the `state` record is
    /// written atomically (a temporary file renamed over it). What was done stays in the logs
    /// (`-v`), not here.
    pub(crate) fn open(host: &HostRoot, _lock: &Lock, replay: &Replay) -> Result<Journal, ChangeError> {
        let path = journal_path(host);
        let mut compacted = None;
        let mut truncate = false;
        if replay.open.is_empty() && (replay.records > 1 || replay.bad_lines > 0) {
            if replay.bound.is_empty() && replay.held.is_empty() {
                truncate = true;
                compacted = Some(0);
            } else {
                compact(&path, &replay.bound, &replay.held).map_err(jerr(&path, host))?;
                compacted = Some(1);
            }
        }
        let open = || {
            use std::os::unix::fs::OpenOptionsExt;
            let mut o = OpenOptions::new();
            o.create(true).append(true);
            if truncate {
                // `OpenOptions` refuses append with truncate; the flag itself is fine.
                o.custom_flags(libc_o_trunc());
            }
            o.open(&path)
        };
        // The directory is the lock's, made before the lock was taken: made again only if gone.
        let file = match open() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let dir = host.run_gpupass();
                fs::create_dir_all(&dir).map_err(jerr(&dir, host))?;
                open()
            }
            r => r,
        }
        .map_err(jerr(&path, host))?;
        Ok(Journal {
            display: host.display(&path).into(),
            path,
            file,
            compacted,
            appended: Vec::new(),
            torn: false,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Append one record: one write of the whole line. The records that recovery stands on
    /// are `fdatasync`ed: a `change` (or `extend`) before the first write it announces, and
    /// the end of a transaction (`commit`, `rolled_back`, `recovered`). A `step` or `undo`
    /// (which write of the plan was made last, for the messages; rollback and recovery are
    /// state-based on the `change` record's objects) is written before its write but not
    /// synced: once `write(2)` returns, a crash of the process keeps it, and after a crash of
    /// the machine the `change` record alone restores the host.
    pub(crate) fn append(&mut self, rec: Record) -> Result<(), ChangeError> {
        let sync = !matches!(rec, Record::Step { .. } | Record::Undo { .. });
        let mut line =
            serde_json::to_string(&Line { v: VERSION, rec }).map_err(|e| ChangeError::Journal {
                path: self.display.clone(),
                source: io::Error::other(e),
            })?;
        line.push('\n');
        let r =
            self.file.write_all(line.as_bytes()).and_then(
                |_| {
                    if sync {
                        self.file.sync_data()
                    } else {
                        Ok(())
                    }
                },
            );
        match r {
            Ok(()) => {
                self.appended.push(line);
                Ok(())
            }
            Err(source) => {
                self.torn = true;
                Err(ChangeError::Journal {
                    path: self.display.clone(),
                    source,
                })
            }
        }
    }

    /// Bring `replay` (the journal as read before [`Journal::open`]) to what the journal holds
    /// now: the compaction, then the lines this journal appended, replayed on top. The same
    /// as reading the journal again ([`read`]), without the read; after a failed append, the
    /// read itself.
    pub(crate) fn settle(self, host: &HostRoot, replay: &mut Replay) -> Result<(), ChangeError> {
        if self.torn {
            *replay = read(host)?;
            return Ok(());
        }
        if let Some(records) = self.compacted {
            replay.records = records;
            replay.bad_lines = 0;
        }
        for line in &self.appended {
            replay.feed(line);
        }
        Ok(())
    }
}

/// `O_TRUNC`, for [`Journal::open`].
fn libc_o_trunc() -> i32 {
    rustix::fs::OFlags::TRUNC.bits() as i32
}

fn compact(path: &Path, bound: &BoundState, held: &Held) -> io::Result<()> {
    let line = serde_json::to_string(&Line {
        v: VERSION,
        rec: Record::State {
            bound: bound.iter().map(|(a, s)| (*a, s.clone())).collect(),
            held: held.iter().map(|(k, h)| (k.clone(), h.clone())).collect(),
        },
    })
    .map_err(io::Error::other)?;
    crate::host::write_atomic(path, format!("{line}\n").as_bytes())
}

/// A new transaction id: pid and time.
pub(crate) fn new_txn() -> (String, u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (
        format!("{}-{}", std::process::id(), now.as_millis()),
        now.as_secs(),
    )
}

/// For commands that do not change drivers: if an unfinished plan is in the journal and its
/// process is gone (the lock is free), say so on stderr. Never fails.
pub(crate) fn warn_unfinished(host: &HostRoot) {
    let path = journal_path(host);
    if !path.exists() {
        return;
    }
    let Ok(r) = read(host) else { return };
    if r.open.is_empty() {
        return;
    }
    // Held by a running gpupass: its plan is in progress, not abandoned.
    if let Ok(f) = OpenOptions::new().read(true).write(true).open(lock_path(host)) {
        if let Ok(false) = try_flock(&f) {
            return;
        }
    }
    warn_open(&r.open);
}

/// Whether this process has said so already ([`warn_open`]: once per process).
static UNFINISHED_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Say on stderr that each of `open` is unfinished and how to recover it, once per process.
/// [`warn_unfinished`] says it for the commands that do not take the lock; a command that
/// takes it (the mdev changes) says it from the journal it read under the lock, where every
/// open plan is an abandoned one, instead of reading the journal twice.
pub(crate) fn warn_open(open: &[OpenChange]) {
    if open.is_empty() || UNFINISHED_SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    for t in open {
        if t.domain == "bind" || t.domain == "unbind" {
            messages::warn(format_args!(
                "an unfinished gpupass {}; devices may be half-moved. Run `gpupass recover` to restore them (or `gpupass recover --continue` to finish the {})",
                t.describe(),
                t.domain
            ));
            continue;
        }
        messages::warn(format_args!(
            "an unfinished gpupass {}. Run `gpupass recover` to undo it (or `gpupass recover --continue` to finish it)",
            t.describe()
        ));
    }
}

#[cfg(test)]
mod tests;
