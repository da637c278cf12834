//! `labjudge`: the lab's Rust judges (tests/it/labjudge) as a program, for lab/lab.sh and for
//! people (docs/lab.md, "Judged scenarios").
//!
//!   labjudge judge SCENARIO DIR    judge an output directory (target/lab/out/SCENARIO): prints
//!                                  the LAB-STEPS line and one LAB-RESULT line per step; exit 0
//!                                  when every step passes, 1 when one fails
//!   labjudge steps SCENARIO...     the steps each scenario's judge decides (and host/ steps);
//!                                  one line per kernel leg for a judge whose legs differ
//!   labjudge list                  the judged scenarios

#[path = "../../tests/it/labjudge/mod.rs"]
mod labjudge;

use std::process::ExitCode;

const USAGE: &str = "usage: labjudge judge SCENARIO DIR | labjudge steps SCENARIO... | labjudge list";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["judge", scenario, dir] => {
            let Some(j) = labjudge::judge_of(scenario) else {
                return unknown(scenario);
            };
            let dir = std::path::Path::new(dir);
            if !dir.is_dir() {
                eprintln!(
                    "labjudge: {} is not a directory (a scenario's output, e.g. target/lab/out/{scenario})",
                    dir.display()
                );
                return ExitCode::from(2);
            }
            let findings = j.run(dir);
            print!("{}", j.log(dir, &findings));
            if labjudge::failures(&findings).is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        ["steps", scenarios @ ..] if !scenarios.is_empty() => {
            for s in scenarios {
                let Some(j) = labjudge::judge_of(s) else {
                    return unknown(s);
                };
                let legs = j.legs();
                if legs.is_empty() {
                    println!("{s}: {}", j.steps().join(" "));
                }
                for l in legs {
                    println!("{s} ({l}): {}", j.steps_on(Some(l)).join(" "));
                }
            }
            ExitCode::SUCCESS
        }
        ["list"] => {
            for j in labjudge::judges() {
                println!("{}", j.scenario);
            }
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn unknown(scenario: &str) -> ExitCode {
    let have: Vec<&str> = labjudge::judges().iter().map(|j| j.scenario).collect();
    eprintln!(
        "labjudge: no judge for scenario {scenario:?} (judged: {}); a scenario is judged when its script says `# lab-judge: rust`",
        have.join(" ")
    );
    ExitCode::from(2)
}
