//! The lab's judges in Rust (docs/lab.md, "Judged scenarios"): for a scenario whose script says
//! `# lab-judge: rust`, the guest decides nothing. It runs the commands and ships, for each one,
//! `NAME.out`, `NAME.err` and `NAME.rc` (`lab_cmd`), and what it read itself from sysfs and
//! `/dev` as `NAME.facts` (`lab_facts`: `KEY=VALUE` lines). A judge here reads that output
//! directory and decides every step: its checks, in order, are the scenario's steps.
//!
//! The same source is compiled twice: as a module of the integration tests (`labjudge::`, which
//! judge committed and altered outputs and, in `lab::`, each boot's), and as `lab/judge`, the
//! small program `lab/lab.sh` runs after a boot (`labjudge judge SCENARIO DIR`), whose
//! `LAB-STEPS`/`LAB-RESULT` lines (`judge.log`) are the report's steps and verdict for the
//! scenario (lab/tools/labtool.py). Only `serde_json` and std: the program builds in seconds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub mod bind;
pub mod clusterbind;
pub mod clusterdra;
pub mod clusterhelm;
pub mod clusterslices;
pub mod clustertwo;
pub mod clustervm;
pub mod mdev;
#[cfg(test)]
mod tests;

/// Every judge, by scenario.
pub fn judges() -> [Judge; 8] {
    [
        bind::judge(),
        mdev::judge(),
        clusterhelm::judge(),
        clusterslices::judge(),
        clustertwo::judge(),
        clusterbind::judge(),
        clustervm::judge(),
        clusterdra::judge(),
    ]
}

/// The judge of `scenario`, if it has one.
pub fn judge_of(scenario: &str) -> Option<Judge> {
    judges().into_iter().find(|j| j.scenario == scenario)
}

/// One scenario's output directory, as `labtool collect` left it.
pub struct Out {
    dir: PathBuf,
}

/// A step's result: `Ok(detail)` passes, `Err(why)` fails. One line each.
pub type Verdict = Result<String, String>;

impl Out {
    pub fn new(dir: impl Into<PathBuf>) -> Out {
        Out { dir: dir.into() }
    }

    /// A shipped file's text; a clear error when the guest did not ship it.
    pub fn text(&self, name: &str) -> Result<String, String> {
        let p = self.dir.join(name);
        match std::fs::read(&p) {
            Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
                "{name} is missing from {}: the guest did not ship it (did the step run?)",
                self.dir.display()
            )),
            Err(e) => Err(format!("{}: {e}", p.display())),
        }
    }

    /// The command the guest ran as `name` (`lab_cmd NAME CMD...`).
    pub fn cmd(&self, name: &str) -> Result<Cmd, String> {
        let rc_text = self.text(&format!("{name}.rc"))?;
        let rc = rc_text
            .trim()
            .parse()
            .map_err(|_| format!("{name}.rc holds {:?}, not an exit status", rc_text.trim()))?;
        Ok(Cmd {
            name: name.to_string(),
            out: self.text(&format!("{name}.out"))?,
            err: self.text(&format!("{name}.err"))?,
            rc,
        })
    }

    /// What the guest read itself after step `name` (`lab_facts NAME KEY=VALUE...`).
    pub fn facts(&self, name: &str) -> Result<Facts, String> {
        let text = self.text(&format!("{name}.facts"))?;
        let mut map = BTreeMap::new();
        for line in text.lines().filter(|l| !l.is_empty()) {
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| format!("{name}.facts: {line:?} is not KEY=VALUE"))?;
            map.insert(k.to_string(), v.to_string());
        }
        Ok(Facts {
            name: name.to_string(),
            map,
        })
    }
}

impl Out {
    /// The lab kernel leg the guest ran on, one of `legs`: `leg.facts`, which a scenario with
    /// steps of its own on each leg ships first (`leg=` lab.sh's `--kernel`, `kernel=` the
    /// guest's `uname -r`, which must be of that leg).
    pub fn leg(&self, legs: &[&'static str]) -> Result<&'static str, String> {
        let f = self.facts("leg")?;
        let (leg, kernel) = (f.get("leg")?, f.get("kernel")?);
        let known = legs.iter().find(|l| **l == leg).ok_or_else(|| {
            format!(
                "leg.facts: leg {leg:?} is none of this judge's legs ({})",
                legs.join(" ")
            )
        })?;
        if !leg_matches(known, kernel) {
            return Err(format!(
                "leg.facts: kernel {kernel:?} is not of the {known} leg it names"
            ));
        }
        Ok(known)
    }
}

/// Whether a kernel release is of lab leg `leg`: `leg` itself, or `leg.x` / `leg-x` (6.1
/// matches 6.1.0-57-amd64, not 6.12.118), as lab/tools/labtool.py's `leg_matches`.
pub fn leg_matches(leg: &str, release: &str) -> bool {
    release == leg
        || release
            .strip_prefix(leg)
            .is_some_and(|r| r.starts_with('.') || r.starts_with('-'))
}

/// One command's stdout, stderr and exit status.
#[derive(Debug)]
pub struct Cmd {
    pub name: String,
    pub out: String,
    pub err: String,
    pub rc: i32,
}

impl Cmd {
    /// The last non-empty line of stderr (what a failure says), or `(no stderr)`.
    pub fn last_err(&self) -> &str {
        self.err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("(no stderr)")
    }

    /// Exit status `want`, else an error with the status and what stderr said last.
    pub fn rc_is(&self, want: i32) -> Result<(), String> {
        if self.rc == want {
            Ok(())
        } else {
            Err(format!(
                "{} exited {}, want {want} :: {}",
                self.name,
                self.rc,
                self.last_err()
            ))
        }
    }

    /// Killed by a signal (a crash failpoint aborts): status 128 + the signal, at least `min`.
    pub fn rc_at_least(&self, min: i32) -> Result<(), String> {
        if self.rc >= min {
            Ok(())
        } else {
            Err(format!(
                "{} exited {}, want a crash (>= {min}) :: {}",
                self.name,
                self.rc,
                self.last_err()
            ))
        }
    }

    /// stderr contains `needle`.
    pub fn err_has(&self, needle: &str) -> Result<(), String> {
        if self.err.contains(needle) {
            Ok(())
        } else {
            Err(format!(
                "{}: stderr does not say {needle:?}: {}",
                self.name,
                one_line(&self.err)
            ))
        }
    }

    /// stdout contains `needle`.
    pub fn out_has(&self, needle: &str) -> Result<(), String> {
        if self.out.contains(needle) {
            Ok(())
        } else {
            Err(format!(
                "{}: stdout does not say {needle:?}: {}",
                self.name,
                one_line(&self.out)
            ))
        }
    }

    /// stdout as JSON (a `--json` command).
    pub fn json(&self) -> Result<Value, String> {
        serde_json::from_str(&self.out)
            .map_err(|e| format!("{}: stdout is not JSON ({e}): {}", self.name, one_line(&self.out)))
    }
}

/// The facts of one step.
#[derive(Debug)]
pub struct Facts {
    pub name: String,
    pub map: BTreeMap<String, String>,
}

impl Facts {
    pub fn get(&self, key: &str) -> Result<&str, String> {
        self.map
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| format!("{}.facts has no {key}", self.name))
    }

    /// `key` reads `want`, else an error naming both.
    pub fn is(&self, key: &str, want: &str) -> Verdict {
        let got = self.get(key)?;
        if got == want {
            Ok(got.to_string())
        } else {
            Err(format!("{}: {key} is {got:?}, want {want:?}", self.name))
        }
    }

    /// `key` as a number.
    pub fn num(&self, key: &str) -> Result<i64, String> {
        let v = self.get(key)?;
        v.trim()
            .parse()
            .map_err(|_| format!("{}: {key} is {v:?}, not a number", self.name))
    }
}

/// Text on one line (a `LAB-RESULT` detail): newlines become ` | `, long text is cut.
/// The taints of `device` in a list of ResourceSlices (`kubectl get resourceslices -o json`),
/// each as `KEY=VALUE:EFFECT`; `None` when no slice of the list has the device.
pub fn device_taints(v: &Value, device: &str) -> Option<Vec<String>> {
    let dev = v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["name"] == device)?;
    Some(
        dev["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                format!(
                    "{}={}:{}",
                    t["key"].as_str().unwrap_or(""),
                    t["value"].as_str().unwrap_or(""),
                    t["effect"].as_str().unwrap_or("")
                )
            })
            .collect(),
    )
}

pub fn one_line(s: &str) -> String {
    let mut l: String = s
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    if l.is_empty() {
        l = "(empty)".to_string();
    }
    if l.chars().count() > 400 {
        l = l.chars().take(400).collect::<String>() + " ...";
    }
    l
}

/// One check: the step it decides and how.
pub struct Check {
    pub step: String,
    /// The lab kernel leg whose step it is (`6.12`, `6.1`); `None`: every leg's.
    pub leg: Option<&'static str>,
    run: Box<dyn Fn(&Out) -> Verdict>,
}

/// A check named `step`.
pub fn check(step: impl Into<String>, run: impl Fn(&Out) -> Verdict + 'static) -> Check {
    Check {
        step: step.into(),
        leg: None,
        run: Box::new(run),
    }
}

/// `c` as a step of the kernel leg `leg` only: a scenario that runs on both lab kernels and
/// proves something else on each (the output's leg is `Out::leg`'s).
pub fn on_leg(leg: &'static str, c: Check) -> Check {
    Check { leg: Some(leg), ..c }
}

/// A scenario's judge: its checks in order, and the steps its host-side `.check` reports.
pub struct Judge {
    pub scenario: &'static str,
    /// Steps of `lab/scenarios/<scenario>.check` (reported as `host/NAME`), which the report
    /// requires as well.
    pub host_steps: &'static [&'static str],
    pub checks: Vec<Check>,
}

/// One decided step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub step: String,
    pub pass: bool,
    pub detail: String,
}

impl Judge {
    /// The steps the scenario must report on any leg: every check (each leg's), then
    /// `host/NAME` for the host check's.
    pub fn steps(&self) -> Vec<String> {
        self.steps_on(None)
    }

    /// The kernel legs with steps of their own, in the order of their first check (none for a
    /// judge whose steps are the same on every leg).
    pub fn legs(&self) -> Vec<&'static str> {
        let mut legs = Vec::new();
        for l in self.checks.iter().filter_map(|c| c.leg) {
            if !legs.contains(&l) {
                legs.push(l);
            }
        }
        legs
    }

    /// The checks of leg `leg` (`None`: of every leg), in order.
    pub fn checks_on(&self, leg: Option<&str>) -> Vec<&Check> {
        self.checks
            .iter()
            .filter(|c| leg.is_none() || c.leg.is_none() || c.leg == leg)
            .collect()
    }

    /// The steps the scenario must report on leg `leg` (`None`: on any), then `host/NAME`.
    pub fn steps_on(&self, leg: Option<&str>) -> Vec<String> {
        let mut s: Vec<String> = self.checks_on(leg).iter().map(|c| c.step.clone()).collect();
        s.extend(self.host_steps.iter().map(|h| format!("host/{h}")));
        s
    }

    /// The leg of the output in `dir`: `Ok(None)` for a judge without legs; `Err` when the
    /// judge has legs and the output does not say which (`Out::leg`).
    pub fn leg_of(&self, dir: &Path) -> Result<Option<&'static str>, String> {
        let legs = self.legs();
        if legs.is_empty() {
            return Ok(None);
        }
        Out::new(dir).leg(&legs).map(Some)
    }

    /// The steps of the output in `dir`: its leg's, or every leg's when its leg is unknown.
    pub fn steps_in(&self, dir: &Path) -> Vec<String> {
        self.steps_on(self.leg_of(dir).ok().flatten())
    }

    /// Every check of the output directory `dir`'s leg on it. When the judge has legs and the
    /// output does not say which, every leg's checks run, those of one leg failing with why.
    pub fn run(&self, dir: &Path) -> Vec<Finding> {
        let out = Out::new(dir);
        let leg = self.leg_of(dir);
        self.checks_on(leg.as_ref().ok().copied().flatten())
            .iter()
            .map(|c| {
                let verdict = match (&leg, c.leg) {
                    (Err(why), Some(l)) => Err(format!("a step of the {l} leg, and {why}")),
                    _ => (c.run)(&out),
                };
                let (pass, detail) = match verdict {
                    Ok(d) => (true, d),
                    Err(d) => (false, d),
                };
                Finding {
                    step: c.step.clone(),
                    pass,
                    detail: one_line(&detail),
                }
            })
            .collect()
    }

    /// What `lab/lab.sh` keeps as `judge.log` and the report reads: a `LAB-STEPS` line naming
    /// every step of `dir`'s leg, then one `LAB-RESULT` line per finding (docs/lab.md,
    /// "Judged scenarios").
    pub fn log(&self, dir: &Path, findings: &[Finding]) -> String {
        let mut s = format!("LAB-STEPS {} {}\n", self.scenario, self.steps_in(dir).join(" "));
        for f in findings {
            s += &format!(
                "LAB-RESULT {} {} {} {}\n",
                self.scenario,
                f.step,
                if f.pass { "PASS" } else { "FAIL" },
                f.detail
            );
        }
        s
    }
}

/// The failures among `findings`, one `step: detail` line each.
pub fn failures(findings: &[Finding]) -> Vec<String> {
    findings
        .iter()
        .filter(|f| !f.pass)
        .map(|f| format!("{}: {}", f.step, f.detail))
        .collect()
}

/// The number of writes in a `--dry-run --json` plan (`plan.steps` of kind `write`,
/// `write_file`, `remove_file`: the unit of the failpoints, docs/bind.md).
pub fn plan_writes(v: &Value) -> Result<usize, String> {
    let steps = v["plan"]["steps"]
        .as_array()
        .ok_or_else(|| format!("no plan.steps in {}", one_line(&v.to_string())))?;
    Ok(steps
        .iter()
        .filter(|s| matches!(s["kind"].as_str(), Some("write" | "write_file" | "remove_file")))
        .count())
}
