//! The timeline of a run whose workload shifts during the measured window
//! (the `phases` parameter, the `adaptive` scenario): each point's
//! commands per second with the phase boundaries and every change of a
//! replica's scheduler marked, and each phase's throughput per point next
//! to the best fixed scheduler's.

use crate::compare::{is_auto, siblings};
use crate::report::{chart_marked, Mark, PointResult};
use crate::scenario::PHASE_KEYS;
use std::fmt::Write;

/// The phases of `p`'s window as `key=value+...` labels, the first from
/// the point's own settings of the keys the later ones change; one phase
/// (no label) when its workload does not shift.
pub fn phases(p: &PointResult) -> Vec<String> {
    let later: Vec<&str> = match p.params.get("phases").map(String::as_str) {
        None | Some("none") => return vec![String::new()],
        Some(spec) => spec.split(';').collect(),
    };
    let changed: Vec<&str> = PHASE_KEYS.into_iter().filter(|k| later.iter().any(|ph| ph.contains(k))).collect();
    let first: Vec<String> = changed.iter().filter_map(|k| p.params.get(*k).map(|v| format!("{k}={v}"))).collect();
    std::iter::once(first.join("+")).chain(later.into_iter().map(str::to_string)).collect()
}

/// The measured window of `p`, seconds.
fn window_s(p: &PointResult) -> f64 {
    p.params.get("duration_s").and_then(|v| v.parse().ok()).unwrap_or(p.timeline.len() as f64)
}

/// Commands per second in each second of `p`'s window, at the middle of
/// the second (the last one may be shorter).
fn per_second(p: &PointResult) -> Vec<(f64, f64)> {
    let end = window_s(p);
    p.timeline
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let len = (end.min(i as f64 + 1.0) - i as f64).max(1e-3);
            (i as f64 + len / 2.0, n as f64 / len)
        })
        .collect()
}

/// Mean commands per second of `p` in each of `phases` equal parts of its
/// window: over the seconds wholly inside the part, or those it overlaps
/// when it holds none.
fn phase_means(p: &PointResult, phases: usize) -> Vec<f64> {
    let (end, rates) = (window_s(p), per_second(p));
    (0..phases)
        .map(|k| {
            let (a, b) = (end * k as f64 / phases as f64, end * (k + 1) as f64 / phases as f64);
            let inside = |i: usize, whole: bool| {
                let (s, e) = (i as f64, end.min(i as f64 + 1.0));
                if whole {
                    s >= a - 1e-9 && e <= b + 1e-9
                } else {
                    e > a && s < b
                }
            };
            let pick = |whole| -> Vec<f64> {
                rates.iter().enumerate().filter(|(i, _)| inside(*i, whole)).map(|(_, r)| r.1).collect()
            };
            let whole = pick(true);
            let chosen = if whole.is_empty() { pick(false) } else { whole };
            chosen.iter().sum::<f64>() / chosen.len().max(1) as f64
        })
        .collect()
}

fn shifts(p: &PointResult) -> bool {
    phases(p).len() > 1
}

/// Commands per second, second by second, of every point whose workload
/// shifts, with the phase boundaries (grey) and the replicas' scheduler
/// switches (red) marked; `None` when no point's workload shifts.
pub fn svg(title: &str, points: &[PointResult]) -> Option<String> {
    let shifting: Vec<&PointResult> = points.iter().filter(|p| shifts(p)).collect();
    let first = shifting.first()?;
    let lines: Vec<(String, Vec<(f64, f64)>)> = shifting.iter().map(|p| (p.name.clone(), per_second(p))).collect();
    let labels = phases(first);
    let end = window_s(first);
    let mut marks: Vec<Mark> = labels
        .iter()
        .enumerate()
        .skip(1)
        .map(|(k, l)| Mark {
            x: end * k as f64 / labels.len() as f64,
            label: format!("phase {}: {l}", k + 1),
            strong: false,
            until: None,
        })
        .collect();
    for p in &shifting {
        for s in &p.switches {
            let port = s.replica.rsplit(':').next().unwrap_or(&s.replica);
            marks.push(Mark { x: s.at_s, label: format!(":{port} {}", s.scheduler), strong: true, until: None });
        }
    }
    Some(chart_marked(
        &format!("{title}: commands per second"),
        "second of the window",
        "commands/s",
        &lines,
        &[],
        &marks,
    ))
}

/// Commands per second of `p`, second by second, with its faults drawn
/// over them: each nemesis fault a band from its start to its heal, and
/// each kill or restart a line; `None` without faults.
pub fn faults_svg(p: &PointResult) -> Option<String> {
    if p.events.is_empty() {
        return None;
    }
    let warmup: f64 = p.params.get("warmup_s").and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let mut marks = Vec::new();
    let mut healed = vec![false; p.events.len()];
    for e in &p.events {
        let x = e.at_s - warmup;
        let Some((kind, _)) = e.action.split_once(": ") else {
            if !e.action.starts_with("heal ") {
                marks.push(Mark { x, label: format!("{} {}", e.action, e.replica), strong: true, until: None });
            }
            continue;
        };
        // Its heal: the first heal of its kind after it not yet taken.
        let heal = p.events.iter().enumerate().find(|(k, h)| {
            let healing = h.action.strip_prefix("heal ").and_then(|a| a.split_once(" of "));
            !healed[*k] && h.at_s >= e.at_s && healing.is_some_and(|(k, _)| k == kind)
        });
        let until = heal.map(|(k, h)| {
            healed[k] = true;
            h.at_s - warmup
        });
        marks.push(Mark { x, label: e.action.clone(), strong: false, until });
    }
    Some(chart_marked(
        &format!("{}: commands per second under faults", p.name),
        "second of the window (after the warm-up)",
        "commands/s",
        &[(String::new(), per_second(p))],
        &[],
        &marks,
    ))
}

/// The report's section on shifting workloads: each phase's throughput per
/// point, `auto` against the best fixed scheduler over the whole window
/// and against the best per phase, and every scheduler switch seen.
pub fn markdown(s: &mut String, points: &[PointResult]) {
    let shifting: Vec<&PointResult> = points.iter().filter(|p| shifts(p)).collect();
    let Some(first) = shifting.first() else { return };
    let labels = phases(first);
    let _ = writeln!(s, "\n## The workload over time\n");
    let _ = writeln!(
        s,
        "The measured window is cut into {} equal phases; commands/s per phase (the seconds wholly inside it).\n",
        labels.len()
    );
    let _ = writeln!(s, "![timeline](timeline.svg)\n");
    let mut header = String::from("| point |");
    for (k, l) in labels.iter().enumerate() {
        let _ = write!(header, " phase {}: {l} |", k + 1);
    }
    let _ = writeln!(s, "{header} whole window |");
    let _ = writeln!(s, "| --- |{} ---: |", " ---: |".repeat(labels.len()));
    for p in &shifting {
        let cells: Vec<String> = phase_means(p, labels.len()).iter().map(|m| format!("{m:.0}")).collect();
        let _ = writeln!(s, "| {} | {} | {:.0} |", p.name, cells.join(" | "), p.commands_per_s);
    }
    for auto in shifting.iter().filter(|p| is_auto(p)) {
        auto_against_fixed(s, auto, &siblings(auto, points), labels.len());
    }
    let switched: Vec<&&PointResult> = shifting.iter().filter(|p| !p.switches.is_empty()).collect();
    if !switched.is_empty() {
        let _ = writeln!(s, "\nScheduler switches, as each replica's counters showed them, read every second:\n");
        let _ = writeln!(s, "| point | seen at (s) | replica | runs since | decision |");
        let _ = writeln!(s, "| --- | ---: | --- | --- | --- |");
        for p in switched {
            for w in &p.switches {
                let _ =
                    writeln!(s, "| {} | {:.0} | {} | {} | {} |", p.name, w.at_s, w.replica, w.scheduler, w.decision);
            }
        }
    }
}

/// One line: `auto`'s window against the best fixed point's, and against
/// the best fixed point of each phase (a choice that switches for free).
fn auto_against_fixed(s: &mut String, auto: &PointResult, group: &[&PointResult], phases: usize) {
    let fixed: Vec<&&PointResult> = group.iter().filter(|q| !is_auto(q) && q.commands_per_s > 0.0).collect();
    let Some(best) = fixed.iter().max_by(|a, b| a.commands_per_s.total_cmp(&b.commands_per_s)) else { return };
    let oracle: f64 =
        (0..phases).map(|k| fixed.iter().map(|q| phase_means(q, phases)[k]).fold(0.0, f64::max)).sum::<f64>()
            / phases as f64;
    let mine = phase_means(auto, phases).iter().sum::<f64>() / phases as f64;
    let best_phases = phase_means(best, phases).iter().sum::<f64>() / phases as f64;
    let _ = writeln!(
        s,
        "\n{}: {:.2}x the best fixed scheduler over the whole window ({}, {:.0} commands/s); {:.2}x the best fixed scheduler of each phase taken in turn ({:.0} commands/s on average over the phases, against {mine:.0}). Switching for free to the best of each phase would reach {:.2}x the best single fixed scheduler: the most any controller could gain on this run.",
        auto.name,
        auto.commands_per_s / best.commands_per_s,
        best.name,
        best.commands_per_s,
        mine / oracle.max(1e-9),
        oracle,
        oracle / best_phases.max(1e-9)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Switch;
    use crate::scenario::{expand, find};

    fn point(scheduler: &str, timeline: Vec<u64>) -> PointResult {
        let scenario = find("adaptive").unwrap();
        let p = expand(&scenario.base, &scenario.sweeps).unwrap().into_iter().find(|p| p.params.scheduler == scheduler);
        let mut r = PointResult::new(&p.unwrap());
        r.params.insert("duration_s".into(), timeline.len().to_string());
        r.commands_per_s = timeline.iter().sum::<u64>() as f64 / timeline.len() as f64;
        r.timeline = timeline;
        r
    }

    #[test]
    fn phases_are_labeled_and_measured_apart() {
        let fast_then_slow = point("sequential", vec![100, 100, 100, 100, 10, 10, 10, 10]);
        let labels = phases(&fast_then_slow);
        assert_eq!(labels.len(), 4);
        assert!(labels[0].starts_with("workload=0-0-0"), "{labels:?}");
        assert_eq!(phase_means(&fast_then_slow, 4), [100.0, 100.0, 10.0, 10.0]);
        assert_eq!(phase_means(&fast_then_slow, 3), [100.0, 55.0, 10.0], "parts not on whole seconds");
        let mut uneven = point("sequential", vec![10, 10, 5]);
        uneven.params.insert("duration_s".into(), "2.5".into());
        assert_eq!(per_second(&uneven)[2], (2.25, 10.0), "the last, half second");
    }

    #[test]
    fn auto_is_compared_with_the_best_fixed_choice_overall_and_per_phase() {
        let a = point("sequential", vec![100, 100, 100, 100, 10, 10, 10, 10]);
        let b = point("early", vec![10, 10, 10, 10, 80, 80, 80, 80]);
        let mut auto = point("auto", vec![100, 100, 100, 100, 80, 80, 80, 80]);
        auto.switches.push(Switch {
            at_s: 5.0,
            replica: "127.0.0.1:7001".into(),
            scheduler: "auto: early, 2 workers".into(),
            decision: "to early after window 41: writes".into(),
        });
        let mut md = String::new();
        markdown(&mut md, &[a.clone(), b.clone(), auto.clone()]);
        assert!(md.contains("1.64x the best fixed scheduler over the whole window (scheduler=sequential"), "{md}");
        assert!(md.contains("1.00x the best fixed scheduler of each phase"), "{md}");
        assert!(md.contains("would reach 1.64x the best single fixed scheduler"), "{md}");
        assert!(md.contains("| scheduler=auto | 5 | 127.0.0.1:7001 | auto: early, 2 workers |"), "{md}");
        let svg = self::svg("adaptive", &[a, b, auto]).unwrap();
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert_eq!(svg.matches("stroke-dasharray=\"6,4\"").count(), 3, "three phase boundaries");
        assert!(svg.contains(":7001 auto: early, 2 workers"));
        let mut steady = point("early", vec![1]);
        steady.params.insert("phases".into(), "none".into());
        assert_eq!(phases(&steady), [""]);
        assert!(self::svg("x", &[steady.clone()]).is_none());
        let mut md = String::new();
        markdown(&mut md, &[steady]);
        assert!(md.is_empty());
    }
}
