//! `psmr simulate` end to end: a clean run exits 0, an injected bug exits
//! non-zero naming the seed to replay, a replay prints the trace, and bad
//! flags give one error line.

use std::process::{Command, Output};

fn psmr(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_psmr")).args(args).output().expect("psmr runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn clean_seeds_pass_and_an_injected_bug_fails_with_its_seed() {
    let o = psmr(&["simulate", "--seeds", "6", "--first-seed", "3", "--steps", "500", "--jobs", "2"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("6 seeds (3..=8)") && out.contains("failed 0"), "{out}");

    let o = psmr(&["simulate", "--seeds", "50", "--bug", "no-reply-cache", "--fail-fast", "--json"]);
    assert!(!o.status.success());
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON report");
    let seed = report["violations"][0]["seed"].as_u64().expect("a violation with its seed");
    assert!(text(&o.stderr).contains("psmr: error:"), "{}", text(&o.stderr));

    // The seed replays: the same violation, with the trace.
    let seed = seed.to_string();
    let o = psmr(&["simulate", "--replay", &seed, "--bug", "no-reply-cache"]);
    assert!(!o.status.success());
    let trace = text(&o.stdout);
    assert!(trace.contains(&format!("seed {seed}:")) && trace.contains("proposes"), "{trace}");
    assert!(text(&o.stderr).contains("double-execution"), "{}", text(&o.stderr));
}

#[test]
fn bad_flags_are_one_error_line() {
    for (args, needle) in [
        (vec!["simulate", "--faults", "loss,earthquake"], "earthquake"),
        (vec!["simulate", "--bug", "typo"], "typo"),
        (vec!["simulate", "--clients", "0"], "clients"),
        (vec!["simulate", "--seeds", "0"], "no seeds"),
    ] {
        let o = psmr(&args);
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(err.contains(needle) && err.starts_with("psmr: error:"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
