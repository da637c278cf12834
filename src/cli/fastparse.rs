//! The command lines of the mdev changes, read without clap.
//!
//! `gpupass mdev create|remove|define|undefine|start|stop` run one process per step, as
//! mdevctl's do, and their start-up was most of their cost: clap builds the `mdev` tree (eight
//! subcommands, their arguments, the value parsers) in fresh heap and code pages before it
//! parses, about half the page faults of a `mdev create` (docs/performance.md, "the mdev
//! commands' own cost"). [`parse`] reads exactly the plain forms of these six command lines
//! and builds the same [`Cli`] clap would; anything else, a help or version flag, a repeated
//! or unknown option, a short option cluster, a value that is empty or starts with `-`, a
//! value that does not parse, a missing or conflicting argument, an option clap spells with
//! `=` after a short name, a global option other than `--root` and `--json`, is left to clap
//! (`None`), which parses, explains and refuses it as before. `tests` hold each accepted line to
//! clap's parse of it, field for field.

use super::mdev::{Attr, MdevCommand};
use super::{Cli, ColorChoice, Command, Globals, LogFormat};
use crate::mdev::{InstanceRef, MdevUuid};
use std::ffi::OsString;
use std::path::PathBuf;

/// The options of one subcommand as given (each at most once; `--attr` repeats).
#[derive(Default)]
struct Given {
    parent: Option<String>,
    ty: Option<String>,
    uuid: Option<String>,
    count: Option<String>,
    attrs: Vec<String>,
    positional: Option<String>,
    dry_run: bool,
    auto: bool,
    manual: bool,
    force: bool,
    auto_all: bool,
}

/// Which options a subcommand takes.
struct Takes {
    parent: bool,
    ty: bool,
    uuid: bool,
    count: bool,
    attr: bool,
    positional: bool,
    auto_manual_force: bool,
    auto_all: bool,
}

fn takes(sub: &str) -> Option<Takes> {
    let none = Takes {
        parent: false,
        ty: false,
        uuid: false,
        count: false,
        attr: false,
        positional: false,
        auto_manual_force: false,
        auto_all: false,
    };
    Some(match sub {
        "create" => Takes {
            parent: true,
            ty: true,
            uuid: true,
            count: true,
            attr: true,
            ..none
        },
        "remove" | "stop" => Takes {
            positional: true,
            ..none
        },
        "define" => Takes {
            parent: true,
            ty: true,
            uuid: true,
            attr: true,
            auto_manual_force: true,
            ..none
        },
        "undefine" => Takes {
            parent: true,
            positional: true,
            ..none
        },
        "start" => Takes {
            parent: true,
            positional: true,
            auto_all: true,
            ..none
        },
        _ => return None,
    })
}

/// Set `slot` once; `None` when it was set already or there is no value.
fn once(slot: &mut Option<String>, v: Option<&str>) -> Option<()> {
    let v = v?;
    if slot.is_some() {
        return None;
    }
    *slot = Some(v.to_string());
    Some(())
}

fn flag(slot: &mut bool) -> Option<()> {
    if *slot {
        return None;
    }
    *slot = true;
    Some(())
}

/// The [`Cli`] of `args` (the process's arguments, the program first) when it is a plain
/// command line of an mdev change; `None` leaves it to clap. `env_root` is `GPUPASS_ROOT`.
pub(crate) fn parse(args: &[OsString], env_root: Option<OsString>) -> Option<Cli> {
    let args: Vec<&str> = args.iter().skip(1).map(|a| a.to_str()).collect::<Option<_>>()?;
    let mut root: Option<PathBuf> = None;
    let mut json = false;
    // The words before the subcommand's own: `mdev`, then the subcommand.
    let mut head: Vec<&str> = Vec::new();
    let mut t: Option<Takes> = None;
    let mut g = Given::default();
    let mut it = args.iter().copied();
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v)),
            _ => (a, None),
        };
        // An option's value: the rest after `=`, else the next word, plain (not empty, not
        // option-like: clap would read those otherwise).
        let mut value = || {
            inline
                .or_else(|| it.next())
                .filter(|v| !v.is_empty() && !v.starts_with('-'))
        };
        // The global options, before or after the subcommand.
        if name == "--root" {
            if root.is_some() {
                return None;
            }
            root = Some(PathBuf::from(value()?));
            continue;
        }
        if name == "--json" && inline.is_none() {
            flag(&mut json)?;
            continue;
        }
        let Some(t) = &t else {
            // `mdev`, then the subcommand; nothing else before them.
            match (head.len(), a) {
                (0, "mdev") => head.push(a),
                (1, sub) => {
                    t = Some(takes(sub)?);
                    head.push(sub);
                }
                _ => return None,
            }
            continue;
        };
        match name {
            "--parent" | "-p" if t.parent => once(&mut g.parent, value())?,
            "--type" | "-t" if t.ty => once(&mut g.ty, value())?,
            "--uuid" | "-u" if t.uuid => once(&mut g.uuid, value())?,
            "--count" if t.count => once(&mut g.count, value())?,
            "--attr" if t.attr => g.attrs.push(value()?.to_string()),
            "--dry-run" if inline.is_none() => flag(&mut g.dry_run)?,
            "--auto" | "-a" if t.auto_manual_force && inline.is_none() => flag(&mut g.auto)?,
            "--manual" if t.auto_manual_force && inline.is_none() => flag(&mut g.manual)?,
            "--force" if t.auto_manual_force && inline.is_none() => flag(&mut g.force)?,
            "--auto-all" if t.auto_all && inline.is_none() => flag(&mut g.auto_all)?,
            _ if t.positional && !a.starts_with('-') && !a.is_empty() && g.positional.is_none() => {
                g.positional = Some(a.to_string())
            }
            _ => return None,
        }
    }
    let sub = *head.get(1)?;
    let uuid = |s: &Option<String>| -> Option<Option<MdevUuid>> {
        match s {
            None => Some(None),
            Some(s) => s.parse::<MdevUuid>().ok().map(Some),
        }
    };
    let attrs = || -> Option<Vec<Attr>> { g.attrs.iter().map(|a| a.parse::<Attr>().ok()).collect() };
    let command = match sub {
        "create" => {
            let count = match &g.count {
                None => 1,
                Some(c) if c.bytes().all(|b| b.is_ascii_digit()) => {
                    c.parse::<u32>().ok().filter(|n| (1..=4096).contains(n))?
                }
                Some(_) => return None,
            };
            MdevCommand::Create {
                parent: g.parent.clone()?,
                ty: g.ty.clone()?,
                uuid: uuid(&g.uuid)?,
                count,
                attrs: attrs()?,
                dry_run: g.dry_run,
            }
        }
        "remove" => MdevCommand::Remove {
            instance: g.positional.as_deref()?.parse::<InstanceRef>().ok()?,
            dry_run: g.dry_run,
        },
        "stop" => MdevCommand::Stop {
            uuid: g.positional.as_deref()?.parse::<MdevUuid>().ok()?,
            dry_run: g.dry_run,
        },
        "define" => {
            if g.auto && g.manual {
                return None;
            }
            MdevCommand::Define {
                parent: g.parent.clone(),
                ty: g.ty.clone(),
                uuid: uuid(&g.uuid)?,
                auto: g.auto,
                manual: g.manual,
                attrs: attrs()?,
                force: g.force,
                dry_run: g.dry_run,
            }
        }
        "undefine" => MdevCommand::Undefine {
            uuid: g.positional.as_deref()?.parse::<MdevUuid>().ok()?,
            parent: g.parent.clone(),
            dry_run: g.dry_run,
        },
        "start" => {
            // A UUID or --auto-all, not both.
            if g.auto_all == g.positional.is_some() {
                return None;
            }
            MdevCommand::Start {
                uuid: uuid(&g.positional)?,
                parent: g.parent.clone(),
                auto_all: g.auto_all,
                dry_run: g.dry_run,
            }
        }
        _ => return None,
    };
    let root = match (root, env_root) {
        (Some(r), _) => Some(r),
        (None, None) => None,
        // clap's reading of an empty or non-UTF-8 variable is clap's.
        (None, Some(e)) => Some(PathBuf::from(e.to_str().filter(|s| !s.is_empty())?)),
    };
    Some(Cli {
        globals: Globals {
            verbose: 0,
            log_format: LogFormat::Text,
            color: ColorChoice::Auto,
            root,
            from_json: None,
            json,
        },
        command: Command::Mdev(command),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    const U: &str = "dddddddd-1111-4222-8333-444444444444";

    fn os<S: AsRef<str>>(v: &[S]) -> Vec<OsString> {
        v.iter().map(|w| OsString::from(w.as_ref())).collect()
    }

    /// `gpupass` and the words of `line` (`$U`: [`U`]).
    fn argv(line: &str) -> Vec<String> {
        std::iter::once("gpupass")
            .chain(line.split_whitespace())
            .map(|w| if w == "$U" { U } else { w }.to_string())
            .collect()
    }

    /// clap's parse of `argv` (Debug), or its error.
    fn claps<S: AsRef<str>>(argv: &[S]) -> Result<String, String> {
        Cli::try_parse_from(argv.iter().map(|w| w.as_ref()))
            .map(|c| format!("{c:?}"))
            .map_err(|e| e.to_string())
    }

    /// Every line the fast path reads, it reads as clap does; the lines of the benchmarks and
    /// the documentation are read by it (so the comparison is not vacuous); the others are
    /// left to clap.
    #[test]
    fn the_fast_path_reads_what_clap_reads_and_leaves_the_rest() {
        let env = std::env::var_os("GPUPASS_ROOT");
        let taken: Vec<Vec<String>> = [
            "mdev create --parent mbochs --type mbochs-small --uuid $U",
            "mdev create -p mtty -t mtty-1 --count 2 --dry-run",
            "mdev create --parent=mdpy --type=mdpy-vga --attr a=1 --attr b=",
            "--root /tmp/x mdev create -p mbochs -t mbochs-small -u $U",
            "mdev create -p mbochs -t mbochs-small --json --root=/r",
            "mdev remove $U",
            "mdev remove 0000:01:00.4 --dry-run",
            "mdev remove 41:00.4",
            "--json mdev stop $U",
            "mdev define --parent mbochs --type mbochs-small --uuid $U",
            "mdev define -p mbochs -t mbochs-small -a --force --attr x=y",
            "mdev define --uuid $U --manual --dry-run",
            "mdev undefine $U",
            "mdev undefine $U -p mbochs --dry-run",
            "mdev start $U",
            "mdev start $U --parent mbochs",
            "mdev start --auto-all --dry-run",
            "mdev stop $U --dry-run",
            "mdev create -p mbochs -t x --count 4096",
        ]
        .iter()
        .map(|l| argv(l))
        .collect();
        for argv in &taken {
            let fast = parse(&os(argv), env.clone()).unwrap_or_else(|| panic!("not taken: {argv:?}"));
            assert_eq!(Ok(format!("{fast:?}")), claps(argv), "{argv:?}");
        }
        let mut left: Vec<Vec<String>> = [
            "mdev create --parent mbochs",
            "mdev create -p mbochs -t x -u 1234",
            "mdev create -p mbochs -t x --count 0",
            "mdev create -p mbochs -t x --count 4097",
            "mdev create -p mbochs -t x --count +2",
            "mdev create -p mbochs -p mdpy -t x",
            "mdev create -p mbochs -t x --attr noequals",
            "mdev create -p mbochs -t x --attr a/b=1",
            "mdev create -p -t x",
            "mdev create -pmbochs -t x",
            "mdev create -p=mbochs -t x",
            "mdev create -p mbochs -t x --dry-run --dry-run",
            "mdev create -p mbochs -t x extra",
            "mdev create --help",
            "mdev create -p mbochs -t x -- y",
            "-v mdev remove $U",
            "mdev remove $U -vv --log-format json",
            "--color never mdev remove $U",
            "--from-json f.json mdev remove $U",
            "mdev remove",
            "mdev remove $U $U",
            "mdev remove nope",
            "mdev stop 0000:01:00.4",
            "mdev define -p mdpy -t mdpy-vga --auto --manual",
            "mdev define -a -a",
            "mdev undefine",
            "mdev start",
            "mdev start $U --auto-all",
            "mdev list",
            "mdev types -p mbochs",
            "mdev",
            "mdev bogus",
            "bind 01:00.0",
            "--root mdev mdev remove $U",
            "--root /a --root /b mdev remove $U",
            "--json --json mdev remove $U",
            "--version",
            "mdev remove $U --version",
            "mdev stop $U -h",
            "mdev create --count=2 -p a -t b --uuid $U",
            "mdev create -p --json mbochs -t x",
            "mdev create -p --root /r mbochs -t x",
            "mdev create -p a -t b --json=true",
            "mdev create -p a -t b --dry-run=yes",
            "mdev --json",
            "--json",
        ]
        .iter()
        .map(|l| argv(l))
        .collect();
        // An empty value (a word split_whitespace cannot give).
        left.push(
            ["gpupass", "mdev", "create", "-p", "", "-t", "x"]
                .map(String::from)
                .to_vec(),
        );
        for argv in &left {
            // Left to clap, or read exactly as clap reads it.
            if let Some(fast) = parse(&os(argv), env.clone()) {
                assert_eq!(Ok(format!("{fast:?}")), claps(argv), "{argv:?}");
            }
        }
        // What clap refuses, the fast path never takes.
        for argv in left.iter().filter(|a| claps(a).is_err()) {
            assert!(parse(&os(argv), env.clone()).is_none(), "{argv:?}");
        }
        // GPUPASS_ROOT as clap reads it: the variable, unless --root says otherwise.
        let with_env = parse(&os(&["gpupass", "mdev", "remove", U]), Some("/e".into())).unwrap();
        assert_eq!(with_env.globals.root, Some(PathBuf::from("/e")));
        let given = parse(
            &os(&["gpupass", "--root", "/r", "mdev", "remove", U]),
            Some("/e".into()),
        )
        .unwrap();
        assert_eq!(given.globals.root, Some(PathBuf::from("/r")));
        assert!(parse(&os(&["gpupass", "mdev", "remove", U]), Some("".into())).is_none());
    }
}
