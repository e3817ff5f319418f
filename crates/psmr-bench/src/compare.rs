//! Points set against each other: the points of one run that differ only
//! in what executes, `auto` against the best fixed scheduler among them,
//! and one point measured several times (`psmr bench --repeat`).
//!
//! On a machine whose cores the replicas and the clients share, two runs
//! of the same point can differ by more than two schedulers do, so a
//! comparison of single runs decides little. `--repeat N` runs every point
//! N times, in N rounds of all the points (a drift in the machine's speed
//! then touches every point alike), each round in its own order
//! ([`round_order`]), and each point is reported by its run of median
//! throughput, with every run's figure beside it.

use crate::report::PointResult;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::fmt::Write as _;

/// The parameters that say what executes; points that differ only in
/// them run the same workload on the same cluster.
fn executes(key: &str) -> bool {
    key == "scheduler" || key == "workers" || key == "mapping"
}

/// The points of `points` that differ from `p` only in what executes
/// (scheduler, workers, mapping), `p` included.
pub(crate) fn siblings<'a>(p: &PointResult, points: &'a [PointResult]) -> Vec<&'a PointResult> {
    points.iter().filter(|q| q.params.iter().all(|(k, v)| executes(k) || p.params.get(k) == Some(v))).collect()
}

/// Whether `p` ran `auto`.
pub(crate) fn is_auto(p: &PointResult) -> bool {
    scheduler(p) == Some("auto")
}

fn scheduler(p: &PointResult) -> Option<&str> {
    p.params.get("scheduler").map(String::as_str)
}

/// The point of the same run that differs from `p` only in running
/// `sequential` (and its worker count or mapping), if there is one.
pub(crate) fn sequential_twin<'a>(p: &PointResult, points: &'a [PointResult]) -> Option<&'a PointResult> {
    siblings(p, points).into_iter().find(|q| scheduler(q) == Some("sequential"))
}

/// One run of a point standing for all of them: the run of median
/// throughput (the lower of the two middle ones for an even count), so
/// that its latencies, stages and CPU figures are those of a real run,
/// with [`PointResult::runs`] holding every run's commands/s in the order
/// they ran. `None` for no run.
pub fn median_run(mut runs: Vec<PointResult>) -> Option<PointResult> {
    let all: Vec<f64> = runs.iter().map(|r| r.commands_per_s).collect();
    runs.sort_by(|a, b| a.commands_per_s.total_cmp(&b.commands_per_s));
    let n = runs.len();
    if n == 0 {
        return None;
    }
    let mut median = runs.swap_remove((n - 1) / 2);
    if n > 1 {
        median.runs = all;
    }
    Some(median)
}

/// The order in which round `round` (from 1) of `rounds` runs `points`
/// points: as listed when there is one round, else shuffled from `seed`
/// and the round. A point runs a little slower right after a point that
/// loaded the machine hard (a parallel scheduler's busy workers), so a
/// fixed order would favour some points over others in every round.
pub fn round_order(points: usize, rounds: usize, round: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..points).collect();
    if rounds > 1 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ round as u64);
        order.shuffle(&mut rng);
    }
    order
}

/// `auto` at one point against the fixed schedulers that ran its
/// workload.
#[derive(Debug)]
pub struct AutoAgainstFixed<'a> {
    /// The `auto` point.
    pub auto: &'a PointResult,
    /// The fixed scheduler of highest throughput among its siblings.
    pub best: &'a PointResult,
    /// Its `sequential` sibling, if one ran.
    pub sequential: Option<&'a PointResult>,
}

impl AutoAgainstFixed<'_> {
    /// `auto`'s throughput over the best fixed scheduler's.
    pub fn vs_best(&self) -> f64 {
        self.auto.commands_per_s / self.best.commands_per_s
    }

    /// `auto`'s throughput over `sequential`'s.
    pub fn vs_sequential(&self) -> Option<f64> {
        self.sequential.map(|q| self.auto.commands_per_s / q.commands_per_s)
    }
}

/// Every `auto` point of `points` that has a fixed sibling which
/// measured something.
pub fn auto_against_fixed(points: &[PointResult]) -> Vec<AutoAgainstFixed<'_>> {
    let measured = |q: &&PointResult| !is_auto(q) && q.commands_per_s > 0.0;
    points
        .iter()
        .filter(|p| is_auto(p))
        .filter_map(|auto| {
            let fixed: Vec<&PointResult> = siblings(auto, points).into_iter().filter(measured).collect();
            let best = fixed.iter().copied().max_by(|a, b| a.commands_per_s.total_cmp(&b.commands_per_s))?;
            let sequential = fixed.iter().copied().find(|q| scheduler(q) == Some("sequential"));
            Some(AutoAgainstFixed { auto, best, sequential })
        })
        .collect()
}

/// `auto` against the fixed schedulers, one line per `auto` point (empty
/// when there is none): what `psmr bench` prints under its table.
pub fn format_auto(points: &[PointResult]) -> String {
    let mut out = String::new();
    for a in auto_against_fixed(points) {
        let _ = writeln!(
            out,
            "{}: {:.2}x the best fixed scheduler ({}, {:.0} commands/s){}",
            a.auto.name,
            a.vs_best(),
            a.best.name,
            a.best.commands_per_s,
            a.vs_sequential().map_or(String::new(), |r| format!(", {r:.2}x sequential"))
        );
    }
    out
}

/// The report's section on `auto` against the fixed schedulers, if any
/// point ran it.
pub fn markdown(s: &mut String, points: &[PointResult]) {
    let rows = auto_against_fixed(points);
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n## `auto` against the fixed schedulers\n");
    let _ = match runs_per_point(points) {
        0 | 1 => writeln!(s, "Each point ran once: a second run of one point may differ by more than these ratios.\n"),
        n => writeln!(s, "Each point ran {n} times, in rounds of all the points; the ratios are of the medians.\n"),
    };
    let _ = writeln!(s, "| point | best fixed scheduler | its commands/s | auto / best fixed | auto / sequential |");
    let _ = writeln!(s, "| --- | --- | ---: | ---: | ---: |");
    for a in rows {
        let seq = a.vs_sequential().map_or("-".to_string(), |r| format!("{r:.2}x"));
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.2}x | {seq} |",
            a.auto.name,
            a.best.name,
            a.best.commands_per_s,
            a.vs_best()
        );
    }
}

/// The most runs any point of `points` had (0 or 1: each ran once).
pub fn runs_per_point(points: &[PointResult]) -> usize {
    points.iter().map(|p| p.runs.len()).max().unwrap_or(0)
}

/// Every run's commands/s of a repeated point, `a / b / c` in the order
/// they ran; empty for a point run once.
pub fn runs_cell(p: &PointResult) -> String {
    p.runs.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(" / ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{expand, find};

    /// The `write-ratio` scenario's points, each with the throughput `f`
    /// gives its (write_pct, scheduler).
    fn write_ratio(f: impl Fn(&str, &str) -> f64) -> Vec<PointResult> {
        let scenario = find("write-ratio").unwrap();
        expand(&scenario.base, &scenario.sweeps)
            .unwrap()
            .iter()
            .map(|p| {
                let mut r = PointResult::new(p);
                r.commands_per_s = f(&r.params["write_pct"], &r.params["scheduler"]);
                r
            })
            .collect()
    }

    #[test]
    fn auto_is_set_against_the_best_fixed_scheduler_of_its_own_workload() {
        let points = write_ratio(|w, s| match (w, s) {
            ("0", "early") => 500.0,
            ("0", "auto") => 450.0,
            ("15", "auto") => 900.0,
            (_, "sequential") => 300.0,
            (w, _) => 100.0 + w.parse::<f64>().unwrap(),
        });
        let rows = auto_against_fixed(&points);
        assert_eq!(rows.len(), 4, "one row per write ratio");
        let at = |w: &str| rows.iter().find(|r| r.auto.params["write_pct"] == w).unwrap();
        assert_eq!(at("0").best.params["scheduler"], "early");
        assert!((at("0").vs_best() - 0.9).abs() < 1e-9);
        assert!((at("0").vs_sequential().unwrap() - 1.5).abs() < 1e-9);
        assert_eq!(at("15").best.params["scheduler"], "sequential", "auto itself is not a fixed choice");
        assert!((at("15").vs_best() - 3.0).abs() < 1e-9);
        let text = format_auto(&points);
        assert!(text.contains("write_pct=0 scheduler=auto: 0.90x the best fixed scheduler (write_pct=0 scheduler=early, 500 commands/s), 1.50x sequential"), "{text}");
        let mut md = String::new();
        markdown(&mut md, &points);
        assert!(
            md.contains("| write_pct=15 scheduler=auto | write_pct=15 scheduler=sequential | 300 | 3.00x | 3.00x |"),
            "{md}"
        );
        assert!(md.contains("Each point ran once"), "{md}");
    }

    #[test]
    fn without_auto_or_without_a_measured_fixed_point_nothing_is_compared() {
        let fixed_only: Vec<PointResult> = write_ratio(|_, _| 1.0).into_iter().filter(|p| !is_auto(p)).collect();
        assert!(auto_against_fixed(&fixed_only).is_empty());
        let nothing_measured = write_ratio(|_, s| if s == "auto" { 1.0 } else { 0.0 });
        assert!(auto_against_fixed(&nothing_measured).is_empty());
        let mut md = String::new();
        markdown(&mut md, &nothing_measured);
        assert!(md.is_empty());
    }

    #[test]
    fn each_round_runs_every_point_once_in_an_order_of_its_own_from_the_seed() {
        assert_eq!(round_order(5, 1, 1, 7), vec![0, 1, 2, 3, 4], "one round: as listed");
        let orders: Vec<Vec<usize>> = (1..=4).map(|r| round_order(20, 4, r, 7)).collect();
        for o in &orders {
            let mut sorted = o.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..20).collect::<Vec<_>>(), "a permutation: {o:?}");
        }
        assert!(orders.windows(2).all(|w| w[0] != w[1]), "{orders:?}");
        assert_eq!(orders[2], round_order(20, 4, 3, 7), "the same seed gives the same order");
        assert_ne!(orders[2], round_order(20, 4, 3, 8));
        // The point before the last one differs between rounds.
        let before = |o: &Vec<usize>| o.iter().position(|&i| i == 19).filter(|&k| k > 0).map(|k| o[k - 1]);
        let befores: std::collections::BTreeSet<_> = orders.iter().map(before).collect();
        assert!(befores.len() > 1, "{orders:?}");
    }

    #[test]
    fn a_repeated_point_is_its_median_run_with_every_run_beside_it() {
        let runs: Vec<PointResult> = [300.0, 100.0, 500.0, 200.0]
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let mut r = write_ratio(|_, _| c).swap_remove(0);
                r.failed_requests = i as u64;
                r
            })
            .collect();
        let m = median_run(runs.clone()).unwrap();
        assert_eq!(m.commands_per_s, 200.0, "the lower middle of four");
        assert_eq!(m.failed_requests, 3, "the whole run, not a mix of runs");
        assert_eq!(m.runs, vec![300.0, 100.0, 500.0, 200.0], "in the order they ran");
        assert_eq!(runs_cell(&m), "300 / 100 / 500 / 200");
        let m = median_run(runs[..3].to_vec()).unwrap();
        assert_eq!(m.commands_per_s, 300.0);
        let once = median_run(runs[..1].to_vec()).unwrap();
        assert!(once.runs.is_empty(), "a point run once lists no runs");
        assert!(median_run(Vec::new()).is_none());
    }
}
