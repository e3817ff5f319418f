//! What `psmr bench` writes into its output directory: `results.json`,
//! `results.csv`, SVG plots and `report.md`.

use crate::scenario::{Point, Scenario, Sweep};
use psmr_harness::cpu::{self, ReplicaCpu};
use psmr_harness::verdict::Judgement;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Latency percentiles of one command kind, in µs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
}

pub use psmr_harness::load::{StageRow, Switch, WorkerRow};

/// The machine a run measured on, as far as it bounds parallel execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Machine {
    /// Cores this process may run on.
    pub cores: usize,
}

impl Machine {
    /// This machine, as far as this process may use it: its affinity mask
    /// and its cgroup's CPU quota ([`psmr_sched::cpus`]).
    pub fn this() -> Self {
        Self { cores: psmr_sched::cpus::Cpus::read().usable }
    }
}

/// Something done to the cluster during a point (`psmr bench` faults).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Event {
    /// Seconds since the point's load started (warm-up included).
    pub at_s: f64,
    /// `kill` (SIGKILL) or `restart`.
    pub action: String,
    /// The replica.
    pub replica: u64,
    /// Why it could not be done, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A nemesis fault's heal: the longest the clients went without an
    /// answer, from the fault's start until a while after the heal, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_ms: Option<f64>,
    /// A heal: the p99 latency of operations completed during the fault,
    /// ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_during_ms: Option<f64>,
    /// A heal: the same in the seconds after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_after_ms: Option<f64>,
    /// A heal: how long until every replica had applied what the most
    /// advanced had at the heal, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub converged_ms: Option<u64>,
}

/// The measurements of one point.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PointResult {
    /// `scheduler=early workers=2`.
    pub name: String,
    /// The swept values.
    pub label: BTreeMap<String, String>,
    /// Every parameter.
    pub params: BTreeMap<String, String>,
    /// Commands per second over the measured window.
    pub commands_per_s: f64,
    /// With `--repeat`: the commands/s of every run of this point, in the
    /// order they ran; the rest of this result is the median run's
    /// ([`crate::compare::median_run`]). Empty for a point run once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<f64>,
    /// Requests per second.
    pub requests_per_s: f64,
    /// Requests that failed (timed out or refused), warm-up included.
    pub failed_requests: u64,
    /// Latency per command kind (`read`, `write`) and per `request`.
    pub latency_us: BTreeMap<String, Percentiles>,
    /// Commands completed in each second of the window.
    pub timeline: Vec<u64>,
    /// Per replica and stage.
    pub stages: Vec<StageRow>,
    /// Per replica and execution worker (early schedulers only).
    pub workers: Vec<WorkerRow>,
    /// The same for each second of the window (000 Fig. 5.3).
    pub worker_timeline: Vec<Vec<WorkerRow>>,
    /// Changes of the replicas' schedulers during the window, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub switches: Vec<Switch>,
    /// Faults injected, in order.
    pub events: Vec<Event>,
    /// Each replica's CPU time over the window, per command, from its
    /// process's own accounting (local clusters only).
    pub cpu: Vec<ReplicaCpu>,
    /// Why `cpu` is empty or incomplete (e.g. the replicas of `--cluster`
    /// are not processes of this machine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_note: Option<String>,
    /// The class-to-threads mapping the replicas ran, when not their
    /// default, in the compact form `--set mapping=` accepts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mapping_spec: Option<String>,
    /// What each replica executed with at the end of the window, as its
    /// `status` says (`auto` names its choice), by replica in id order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub running: Vec<String>,
    /// A nemesis run's judgement: acknowledged updates lost,
    /// linearizability, convergence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judgement: Option<Judgement>,
}

impl PointResult {
    /// A result for `point` with everything else empty.
    pub fn new(point: &Point) -> Self {
        let params = crate::scenario::keys().filter_map(|k| point.params.get(k).map(|v| (k.to_string(), v))).collect();
        Self {
            name: point.name(),
            label: point.label.iter().cloned().collect(),
            params,
            commands_per_s: 0.0,
            runs: Vec::new(),
            requests_per_s: 0.0,
            failed_requests: 0,
            latency_us: BTreeMap::new(),
            timeline: Vec::new(),
            stages: Vec::new(),
            workers: Vec::new(),
            worker_timeline: Vec::new(),
            switches: Vec::new(),
            events: Vec::new(),
            cpu: Vec::new(),
            cpu_note: None,
            mapping_spec: None,
            running: Vec::new(),
            judgement: None,
        }
    }
}

/// The points' throughput, latency and CPU per command as a readable
/// table, one line each (what `psmr bench` prints).
pub fn format_points(points: &[PointResult]) -> String {
    let mut out = String::new();
    let repeated = crate::compare::runs_per_point(points) > 1;
    let _ = write!(
        out,
        "{:<40} {:>14} {:>12} {:>12} {:>18} {:>20}",
        "point", "commands/s", "p50 ms", "p99 ms", "cpu µs/cmd leader", "followers mean/max"
    );
    let _ = writeln!(out, "{}", if repeated { "   runs (commands/s; the median run is shown)" } else { "" });
    for r in points {
        let l = r.latency_us.get("request").cloned().unwrap_or_default();
        let (leader, followers) = cpu::cells(&r.cpu);
        let _ = write!(
            out,
            "{:<40} {:>14.0} {:>12.2} {:>12.2} {:>18} {:>20}",
            r.name,
            r.commands_per_s,
            l.p50 as f64 / 1e3,
            l.p99 as f64 / 1e3,
            leader,
            followers
        );
        let runs = crate::compare::runs_cell(r);
        let _ = writeln!(out, "{}", if runs.is_empty() { runs } else { format!("   {runs}") });
    }
    out
}

#[derive(Serialize)]
struct Results<'a> {
    scenario: &'a str,
    source: &'a str,
    about: &'a str,
    machine: Machine,
    sweeps: Vec<String>,
    points: &'a [PointResult],
}

/// Writes `results.json`, `results.csv`, `throughput.svg`, `latency.svg`
/// and `report.md` into `dir` (created if needed). Returns the files.
pub fn write_all(
    dir: &Path,
    scenario: &Scenario,
    sweeps: &[Sweep],
    points: &[PointResult],
) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let machine = Machine::this();
    let results = Results {
        scenario: scenario.name,
        source: scenario.source,
        about: scenario.about,
        machine,
        sweeps: sweeps.iter().map(ToString::to_string).collect(),
        points,
    };
    let mut files = vec![
        ("results.json".to_string(), serde_json::to_string_pretty(&results).map_err(std::io::Error::other)? + "\n"),
        ("results.csv".to_string(), csv(points)),
        ("throughput.svg".to_string(), throughput_svg(scenario, sweeps, points)),
        ("latency.svg".to_string(), latency_svg(scenario, sweeps, points)),
        ("report.md".to_string(), markdown(scenario, sweeps, points, machine)),
    ];
    for (i, p) in points.iter().enumerate() {
        if let Some(svg) = workers_svg(p) {
            files.push((format!("workers-{i}.svg"), svg));
        }
    }
    if let Some(svg) = crate::timeline::svg(scenario.name, points) {
        files.push(("timeline.svg".to_string(), svg));
    }
    for (i, p) in points.iter().enumerate() {
        if let Some(svg) = crate::timeline::faults_svg(p) {
            files.push((format!("faults-{i}.svg"), svg));
        }
    }
    write_files(dir, files)
}

/// Writes each `(name, text)` into `dir`; returns the paths.
pub(crate) fn write_files<N: AsRef<Path>>(
    dir: &Path,
    files: Vec<(N, String)>,
) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut written = Vec::new();
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        written.push(path);
    }
    Ok(written)
}

/// The command kinds any point measured, `request` (whole requests) last.
fn kinds(points: &[PointResult]) -> Vec<String> {
    let mut kinds: Vec<String> = points.iter().flat_map(|p| p.latency_us.keys().cloned()).collect();
    kinds.sort();
    kinds.dedup();
    kinds.retain(|k| k != "request");
    kinds.push("request".into());
    kinds
}

/// One row per point: its parameters, failed requests, throughput,
/// percentiles per command kind and CPU µs per command (leader, followers'
/// mean and largest; empty when not measured).
pub fn csv(points: &[PointResult]) -> String {
    let mut out = String::new();
    let keys: Vec<&String> = points.first().map(|p| p.params.keys().collect()).unwrap_or_default();
    let kinds = kinds(points);
    let mut header: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    header.extend([
        "commands_per_s".into(),
        "runs_commands_per_s".into(),
        "requests_per_s".into(),
        "failed_requests".into(),
    ]);
    header.extend(
        ["cpu_us_per_cmd_leader", "cpu_us_per_cmd_followers_mean", "cpu_us_per_cmd_followers_max"].map(String::from),
    );
    for kind in &kinds {
        for q in ["count", "p50_us", "p90_us", "p99_us", "p999_us", "max_us"] {
            header.push(format!("{kind}_{q}"));
        }
    }
    out.push_str(&header.join(","));
    out.push('\n');
    for p in points {
        let mut row: Vec<String> = keys.iter().map(|k| p.params.get(*k).cloned().unwrap_or_default()).collect();
        row.push(format!("{:.1}", p.commands_per_s));
        // Every run's figure, `;`-separated within the one cell.
        row.push(p.runs.iter().map(|r| format!("{r:.1}")).collect::<Vec<_>>().join(";"));
        row.push(format!("{:.1}", p.requests_per_s));
        row.push(p.failed_requests.to_string());
        let figure = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.2}"));
        let followers = cpu::followers_us(&p.cpu);
        row.extend([figure(cpu::leader_us(&p.cpu)), figure(followers.map(|f| f.0)), figure(followers.map(|f| f.1))]);
        for kind in &kinds {
            let l = p.latency_us.get(kind).cloned().unwrap_or_default();
            row.extend([l.count, l.p50, l.p90, l.p99, l.p999, l.max].map(|v| v.to_string()));
        }
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

/// The points grouped into series by every sweep but the first; within a
/// series, the points in order of the first sweep.
fn series(sweeps: &[Sweep], points: &[PointResult]) -> Vec<(String, Vec<usize>)> {
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let name = sweeps
            .iter()
            .skip(1)
            .map(|s| format!("{}={}", s.key, p.label.get(&s.key).map_or("", String::as_str)))
            .collect::<Vec<_>>()
            .join(" ");
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(i),
            None => out.push((name, vec![i])),
        }
    }
    out
}

/// Throughput against the first sweep: a line per series, the x axis
/// numeric when every value is a number, else one slot per value.
pub fn throughput_svg(scenario: &Scenario, sweeps: &[Sweep], points: &[PointResult]) -> String {
    let Some(first) = sweeps.first() else {
        let lines = vec![("".to_string(), vec![(0.0, points.first().map_or(0.0, |p| p.commands_per_s))])];
        return chart(&format!("{}: throughput", scenario.name), "", "commands/s", &lines, &[]);
    };
    let numeric = first.values.iter().all(|v| v.parse::<f64>().is_ok());
    let x_of = |p: &PointResult| -> f64 {
        let v = p.label.get(&first.key).map_or("", String::as_str);
        if numeric {
            v.parse().unwrap_or(0.0)
        } else {
            first.values.iter().position(|w| w == v).unwrap_or(0) as f64
        }
    };
    let lines: Vec<(String, Vec<(f64, f64)>)> = series(sweeps, points)
        .into_iter()
        .map(|(name, idx)| (name, idx.iter().map(|&i| (x_of(&points[i]), points[i].commands_per_s)).collect()))
        .collect();
    let categories: Vec<String> = if numeric { Vec::new() } else { first.values.clone() };
    chart(&format!("{}: throughput", scenario.name), &first.key, "commands/s", &lines, &categories)
}

/// Each worker's synchronization and queue idleness, second by second
/// (000 Fig. 5.3), averaged over the replicas; `None` without workers.
pub fn workers_svg(p: &PointResult) -> Option<String> {
    let workers = p.worker_timeline.iter().flatten().map(|w| w.worker + 1).max()?;
    let mut lines = Vec::new();
    for (what, pick) in [("sync idle", 0), ("queue idle", 1)] {
        for id in 0..workers {
            let pts: Vec<(f64, f64)> = p
                .worker_timeline
                .iter()
                .enumerate()
                .filter_map(|(second, rows)| {
                    let mine: Vec<&WorkerRow> = rows.iter().filter(|w| w.worker == id).collect();
                    (!mine.is_empty()).then(|| {
                        let v: f64 = mine.iter().map(|w| if pick == 0 { w.sync_idle } else { w.queue_idle }).sum();
                        ((second + 1) as f64, 100.0 * v / mine.len() as f64)
                    })
                })
                .collect();
            lines.push((format!("worker {id} {what}"), pts));
        }
    }
    Some(chart(&format!("{}: worker idleness", p.name), "second", "share of the second (%)", &lines, &[]))
}

/// p99 request latency against throughput, a line per series (003 Fig. 3).
pub fn latency_svg(scenario: &Scenario, sweeps: &[Sweep], points: &[PointResult]) -> String {
    let lines: Vec<(String, Vec<(f64, f64)>)> = series(sweeps, points)
        .into_iter()
        .map(|(name, idx)| {
            let mut pts: Vec<(f64, f64)> = idx
                .iter()
                .map(|&i| {
                    let p99 = points[i].latency_us.get("request").map_or(0, |l| l.p99);
                    (points[i].commands_per_s, p99 as f64 / 1000.0)
                })
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (name, pts)
        })
        .collect();
    chart(&format!("{}: p99 latency against throughput", scenario.name), "commands/s", "p99 latency (ms)", &lines, &[])
}

/// A round number at or above `v` for an axis end, so that fifths of it
/// are round too.
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0].into_iter().map(|m| m * p).find(|&c| c >= v).unwrap_or(10.0 * p)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

/// A line chart with markers, axes from 0, a legend. With `categories` the
/// x values are slot indexes labeled by them.
pub fn chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    lines: &[(String, Vec<(f64, f64)>)],
    categories: &[String],
) -> String {
    chart_marked(title, x_label, y_label, lines, categories, &[])
}

/// A vertical line across a chart at `x`, labeled at its top.
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    /// Where, in x units.
    pub x: f64,
    /// Its label, set upright along the line.
    pub label: String,
    /// Its color: dashed grey for `false`, red for `true`.
    pub strong: bool,
    /// With an end: a band from `x` to it (a fault's window) rather than
    /// a line.
    pub until: Option<f64>,
}

/// [`chart`] with vertical `marks` (phase boundaries, decisions).
pub fn chart_marked(
    title: &str,
    x_label: &str,
    y_label: &str,
    lines: &[(String, Vec<(f64, f64)>)],
    categories: &[String],
    marks: &[Mark],
) -> String {
    // Category names are set at a slant below the axis and need more room.
    let bottom = if categories.is_empty() { 60.0 } else { 110.0 };
    let (w, h, left, right, top) = (720.0, 400.0 + bottom, 80.0, 200.0, 40.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let all = lines.iter().flat_map(|(_, p)| p.iter());
    let x_max = if categories.is_empty() {
        nice_ceiling(all.clone().map(|p| p.0).chain(marks.iter().map(|m| m.x)).fold(0.0, f64::max))
    } else {
        (categories.len().max(2) - 1) as f64
    };
    let y_max = nice_ceiling(all.map(|p| p.1).fold(0.0, f64::max));
    let (x0, y0) = if categories.is_empty() { (0.0, 0.0) } else { (-0.5, 0.0) };
    let x_span = if categories.is_empty() { x_max } else { x_max + 1.0 };
    let sx = |x: f64| left + (x - x0) / x_span * pw;
    let sy = |y: f64| top + ph - (y - y0) / y_max * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{}" y="24" font-size="15" text-anchor="middle">{}</text>"#, w / 2.0, escape(title));
    for i in 0..=5 {
        let y = y_max * i as f64 / 5.0;
        let (x_end, y_at, x_text, y_text) = (left + pw, sy(y), left - 6.0, sy(y) + 4.0);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{x_end}" y1="{y_at}" y2="{y_at}" stroke="#ddd"/><text x="{x_text}" y="{y_text}" text-anchor="end">{}</text>"##,
            short(y)
        );
    }
    if categories.is_empty() {
        for i in 0..=5 {
            let x = x_max * i as f64 / 5.0;
            let _ =
                writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, sx(x), top + ph + 18.0, short(x));
        }
    } else {
        for (i, c) in categories.iter().enumerate() {
            let (x, y) = (sx(i as f64), top + ph + 16.0);
            let _ = writeln!(
                s,
                r#"<text x="{x}" y="{y}" text-anchor="end" transform="rotate(-30 {x} {y})">{}</text>"#,
                escape(c)
            );
        }
    }
    let (axis_y, axis_x_end) = (top + ph, left + pw);
    let _ = writeln!(
        s,
        r#"<line x1="{left}" x2="{left}" y1="{top}" y2="{axis_y}" stroke="black"/><line x1="{left}" x2="{axis_x_end}" y1="{axis_y}" y2="{axis_y}" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        left + pw / 2.0,
        h - 16.0,
        escape(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
        top + ph / 2.0,
        escape(y_label)
    );
    for m in marks {
        if let Some(until) = m.until {
            let (x, width) = (sx(m.x), (sx(until) - sx(m.x)).max(1.0));
            let _ = writeln!(
                s,
                r##"<rect x="{x:.1}" y="{top}" width="{width:.1}" height="{ph}" fill="#d62728" fill-opacity="0.12"/>"##
            );
        }
        let (x, color, dash) =
            (sx(m.x), if m.strong { "#d62728" } else { "#888" }, if m.strong { "2,2" } else { "6,4" });
        let _ = writeln!(
            s,
            r#"<line x1="{x:.1}" x2="{x:.1}" y1="{top}" y2="{axis_y}" stroke="{color}" stroke-dasharray="{dash}"/><text x="{:.1}" y="{}" font-size="10" fill="{color}" transform="rotate(90 {:.1} {})">{}</text>"#,
            x + 3.0,
            top + 4.0,
            x + 3.0,
            top + 4.0,
            escape(&m.label)
        );
    }
    for (k, (name, pts)) in lines.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let path: Vec<String> = pts.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y))).collect();
        let _ = writeln!(s, r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#, path.join(" "));
        for &(x, y) in pts {
            let _ = writeln!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"/>"#, sx(x), sy(y));
        }
        if !name.is_empty() {
            let ly = top + 10.0 + 18.0 * k as f64;
            let _ = writeln!(
                s,
                r#"<rect x="{}" y="{}" width="12" height="12" fill="{color}"/><text x="{}" y="{}">{}</text>"#,
                left + pw + 16.0,
                ly - 10.0,
                left + pw + 34.0,
                ly,
                escape(name)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

/// Under the results table: how the CPU columns were measured, and why
/// some are missing.
fn cpu_notes(s: &mut String, points: &[PointResult]) {
    let _ = writeln!(
        s,
        "\nCPU µs per command: each replica process's CPU time over the measured window (`/proc`, all its threads), divided by the commands completed in the window; the leader is the one at the start of the window. `n/a`: not measured."
    );
    for p in points {
        if let Some(note) = &p.cpu_note {
            let _ = writeln!(s, "- {}: {note}", p.name);
        }
        for r in p.cpu.iter().filter(|r| r.error.is_some()) {
            let _ = writeln!(s, "- {}: replica {}: {}", p.name, r.id, r.error.as_deref().unwrap_or(""));
        }
    }
}

/// A point's number parameter `key` (0 if absent).
fn param(p: &PointResult, key: &str) -> usize {
    p.params.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Execution threads per replica at `p`: its workers, or one for
/// `sequential` (the service manager executes); for `auto`, the most any
/// replica ran at the end of the window.
fn execution_threads(p: &PointResult) -> usize {
    match p.params.get("scheduler").map(String::as_str) {
        Some("sequential") => 1,
        Some("auto") if !p.running.is_empty() => p.running.iter().map(|r| running_threads(r)).max().unwrap_or(1),
        _ => param(p, "workers").max(1),
    }
}

/// Execution threads of a replica whose status says `running`
/// (`auto: early with 2 workers`, `sequential`, ...).
fn running_threads(running: &str) -> usize {
    let words: Vec<&str> = running.split_whitespace().collect();
    words.windows(2).find(|w| w[1] == "workers").and_then(|w| w[0].parse().ok()).unwrap_or(1)
}

/// Lines for each point whose execution threads outnumber the cores: the
/// replicas' workers then share cores with each other, and a parallel
/// scheduler may lose to `sequential` for lack of cores, not of merit.
fn core_notes(s: &mut String, points: &[PointResult], machine: Machine) {
    let _ = writeln!(s, "\n## Cores\n");
    let _ = writeln!(
        s,
        "This machine: {} cores usable (affinity mask and CPU quota; each replica's `psmr client status` says its own). Every replica, and the clients, run on them: a parallel scheduler gains only where its workers have cores of their own.\n",
        machine.cores
    );
    let _ = writeln!(
        s,
        "| point | replicas | threads per replica | execution threads, all replicas | vs sequential | note |"
    );
    let _ = writeln!(s, "| --- | ---: | ---: | ---: | ---: | --- |");
    for p in points {
        let replicas = param(p, "replicas").max(1);
        let threads = p.stages.iter().map(|r| r.threads).sum::<usize>() / replicas;
        let threads = if threads == 0 { "n/a".to_string() } else { threads.to_string() };
        let exec = replicas * execution_threads(p);
        let twin = crate::compare::sequential_twin(p, points).filter(|q| q.name != p.name && q.commands_per_s > 0.0);
        let ratio = twin.map(|q| p.commands_per_s / q.commands_per_s);
        let vs = ratio.map_or("-".to_string(), |r| format!("{r:.2}x"));
        let short = exec > machine.cores && execution_threads(p) > 1;
        let waiting = p.stages.iter().map(|r| r.waiting_cpu).sum::<f64>() / p.stages.len().max(1) as f64;
        let note = match (short, ratio) {
            (true, Some(r)) if r < 1.0 => format!(
                "loses to sequential for lack of cores: {exec} execution threads on {} cores, threads runnable without a CPU {:.0} % of the window",
                machine.cores,
                100.0 * waiting
            ),
            (true, _) => format!("{exec} execution threads on {} cores: workers wait for cores", machine.cores),
            _ => String::new(),
        };
        let note = match p.params.get("scheduler").map(String::as_str) {
            Some("auto") if !p.running.is_empty() => {
                format!("auto ran: {}. {note}", p.running.join("; ")).trim_end().to_string()
            }
            _ => note,
        };
        let _ = writeln!(s, "| {} | {replicas} | {threads} | {exec} | {vs} | {note} |", p.name);
    }
}

/// The report: what ran, a table of results, the plots, the stages.
pub fn markdown(scenario: &Scenario, sweeps: &[Sweep], points: &[PointResult], machine: Machine) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# psmr bench: {}\n", scenario.name);
    let _ = writeln!(s, "{}.\n", scenario.about);
    let _ = writeln!(s, "Follows: {}.\n", scenario.source);
    if let Some(p) = points.first() {
        let fixed: Vec<String> = p
            .params
            .iter()
            .filter(|(k, _)| !sweeps.iter().any(|s| &s.key == *k))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(s, "Fixed: {}.\n", fixed.join(", "));
    }
    let swept: Vec<String> = sweeps.iter().map(ToString::to_string).collect();
    if !swept.is_empty() {
        let _ = writeln!(s, "Swept: {}.\n", swept.join("; "));
    }
    // One column per command kind: p50 / p99 / p99.9 of its latency.
    let kinds: Vec<String> = kinds(points).into_iter().filter(|k| k != "request").collect();
    let repeated = crate::compare::runs_per_point(points) > 1;
    let mut header = String::from("| point | commands/s |");
    let mut rule = String::from("| --- | ---: |");
    if repeated {
        header.push_str(" every run, commands/s |");
        rule.push_str(" --- |");
    }
    for k in &kinds {
        header.push_str(&format!(" {k} p50 / p99 / p99.9 ms |"));
        rule.push_str(" ---: |");
    }
    let _ = writeln!(
        s,
        "{header} request max ms | failed requests | cpu µs/cmd leader | cpu µs/cmd followers (mean / max) |"
    );
    let _ = writeln!(s, "{rule} ---: | ---: | ---: | ---: |");
    let ms = |us: u64| format!("{:.2}", us as f64 / 1000.0);
    for p in points {
        let mut row = format!("| {} | {:.0} |", p.name, p.commands_per_s);
        if repeated {
            row.push_str(&format!(" {} |", crate::compare::runs_cell(p)));
        }
        for k in &kinds {
            let cell = p
                .latency_us
                .get(k)
                .filter(|l| l.count > 0)
                .map_or("-".to_string(), |l| format!("{} / {} / {}", ms(l.p50), ms(l.p99), ms(l.p999)));
            row.push_str(&format!(" {cell} |"));
        }
        let max = p.latency_us.get("request").map_or("-".to_string(), |l| ms(l.max));
        let (leader, followers) = cpu::cells(&p.cpu);
        let _ = writeln!(s, "{row} {max} | {} | {leader} | {followers} |", p.failed_requests);
    }
    if repeated {
        let _ = writeln!(
            s,
            "\nEach point ran several times, in rounds of all the points; its row is the run of median commands/s."
        );
    }
    crate::compare::markdown(&mut s, points);
    cpu_notes(&mut s, points);
    core_notes(&mut s, points, machine);
    let mapped: Vec<&PointResult> = points.iter().filter(|p| p.mapping_spec.is_some()).collect();
    if !mapped.is_empty() {
        let _ = writeln!(s, "\nMappings the replicas ran:\n");
        for p in mapped {
            let _ = writeln!(s, "- {}: `{}`", p.name, p.mapping_spec.as_deref().unwrap_or(""));
        }
    }
    crate::timeline::markdown(&mut s, points);
    let _ = writeln!(s, "\n![throughput](throughput.svg)\n\n![latency](latency.svg)\n");
    for (i, p) in points.iter().enumerate() {
        if !p.worker_timeline.iter().all(Vec::is_empty) {
            let _ = writeln!(s, "![workers of {}](workers-{i}.svg)\n", p.name);
        }
    }
    let _ = writeln!(s, "## Where the replicas' threads spent the window\n");
    let _ = writeln!(s, "Averaged over the replicas; busy is on a CPU, waiting is runnable without one.\n");
    let _ = writeln!(s, "| point | stage | busy | waiting for CPU | blocked |");
    let _ = writeln!(s, "| --- | --- | ---: | ---: | ---: |");
    for p in points {
        let mut stages: BTreeMap<&str, (f64, f64, f64, usize)> = BTreeMap::new();
        for r in &p.stages {
            let e = stages.entry(&r.stage).or_default();
            e.0 += r.busy;
            e.1 += r.waiting_cpu;
            e.2 += r.blocked;
            e.3 += 1;
        }
        for (stage, (b, wc, bl, n)) in stages {
            let n = n as f64;
            let _ = writeln!(
                s,
                "| {} | {stage} | {:.0} % | {:.0} % | {:.0} % |",
                p.name,
                100.0 * b / n,
                100.0 * wc / n,
                100.0 * bl / n
            );
        }
    }
    if points.iter().any(|p| !p.workers.is_empty()) {
        let _ = writeln!(s, "\n## Execution workers (000 §5.3)\n");
        let _ = writeln!(s, "Averaged over the replicas, per worker id: idle waiting for other workers (sequential commands) and for work, commands per batch taken, steals that succeeded of those tried.\n");
        let _ = writeln!(s, "| point | worker | executed | sync idle | queue idle | queue size | steals |");
        let _ = writeln!(s, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
        for p in points {
            let workers = p.workers.iter().map(|w| w.worker + 1).max().unwrap_or(0);
            for id in 0..workers {
                let rows: Vec<&WorkerRow> = p.workers.iter().filter(|w| w.worker == id).collect();
                let n = rows.len().max(1) as f64;
                let avg = |f: &dyn Fn(&WorkerRow) -> f64| rows.iter().map(|w| f(w)).sum::<f64>() / n;
                let _ = writeln!(
                    s,
                    "| {} | {id} | {:.0} | {:.0} % | {:.0} % | {:.1} | {}/{} |",
                    p.name,
                    avg(&|w| w.executed as f64),
                    100.0 * avg(&|w| w.sync_idle),
                    100.0 * avg(&|w| w.queue_idle),
                    avg(&|w| w.queue_size),
                    rows.iter().map(|w| w.steals_ok).sum::<u64>(),
                    rows.iter().map(|w| w.steals_tried).sum::<u64>()
                );
            }
        }
    }
    s.push_str(&faults_section(points));
    s.push_str(&judgement_section(points));
    let _ =
        writeln!(s, "\nThroughput per second of each point: `results.json` (`timeline`); every number: `results.csv`.");
    s
}

/// The faults of every point, with what each nemesis fault cost.
fn faults_section(points: &[PointResult]) -> String {
    let mut s = String::new();
    let faults: Vec<&PointResult> = points.iter().filter(|p| !p.events.is_empty()).collect();
    if faults.is_empty() {
        return s;
    }
    let _ = writeln!(s, "\n## Faults\n");
    let _ = writeln!(s, "At a nemesis fault's heal: the longest the clients went without an answer from the fault's start until 5 s after its heal (or the next fault); the p99 latency of the operations completed during the fault and in the 5 s after it; and how long after the heal every replica had applied what the most advanced one had.\n");
    let _ = writeln!(
        s,
        "| point | at (s) | action | replica | longest without an answer (ms) | p99 during (ms) | p99 after (ms) | caught up after (ms) | failed requests in the point |"
    );
    let _ = writeln!(s, "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let ms = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.0}"));
    for p in faults {
        for e in &p.events {
            let what = match &e.error {
                Some(err) => format!("{} (failed: {err})", e.action),
                None => e.action.clone(),
            };
            let replica = if e.replica == 0 { "-".to_string() } else { e.replica.to_string() };
            let caught_up = match (e.converged_ms, e.gap_ms) {
                (Some(c), _) => c.to_string(),
                (None, Some(_)) => "not within 30 s".into(),
                (None, None) => String::new(),
            };
            let _ = writeln!(
                s,
                "| {} | {:.1} | {what} | {replica} | {} | {} | {} | {caught_up} | {} |",
                p.name,
                e.at_s,
                ms(e.gap_ms),
                ms(e.p99_during_ms),
                ms(e.p99_after_ms),
                p.failed_requests
            );
        }
    }
    let _ = writeln!(s, "\nThe per-second `timeline` in `results.json` shows what each fault cost.");
    s
}

/// The judgement of every nemesis point.
fn judgement_section(points: &[PointResult]) -> String {
    let mut s = String::new();
    let judged: Vec<(&PointResult, &Judgement)> =
        points.iter().filter_map(|p| Some((p, p.judgement.as_ref()?))).collect();
    if judged.is_empty() {
        return s;
    }
    let _ = writeln!(s, "\n## Judgement\n");
    let _ = writeln!(s, "After the load: a final read of every key an acknowledged update touched, the history with those reads checked for linearizability, and the replicas' applied index and digest.\n");
    let _ = writeln!(s, "| point | operations | keys read back | acknowledged updates lost | linearizable | replicas agreed after (ms) |");
    let _ = writeln!(s, "| --- | ---: | ---: | ---: | --- | ---: |");
    for (p, j) in &judged {
        let agreed = j.converged_ms.map_or_else(|| format!("not: {}", j.replicas.join(", ")), |ms| ms.to_string());
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {agreed} |",
            p.name,
            j.operations,
            j.keys_read,
            j.lost.len(),
            j.linearizable
        );
    }
    for (p, j) in judged {
        for line in j.lost.iter().take(10) {
            let _ = writeln!(s, "\n- {}: {line}", p.name);
        }
        if let Some(e) = &j.expiry {
            let _ = writeln!(
                s,
                "\n- {}: expiry under moving clocks: {} keys set with TTLs, {} reads, {} seen expired, {} requests failed; {} violations",
                p.name,
                e.keys,
                e.reads,
                e.expired,
                e.failed,
                e.violations.len()
            );
            for v in e.violations.iter().take(10) {
                let _ = writeln!(s, "  - {v}");
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{expand, find};

    fn results(name: &str) -> (Scenario, Vec<PointResult>) {
        let scenario = find(name).unwrap();
        let points = expand(&scenario.base, &scenario.sweeps).unwrap();
        let results = points
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut r = PointResult::new(p);
                r.commands_per_s = 1000.0 * (i + 1) as f64;
                r.latency_us.insert(
                    "request".into(),
                    Percentiles { count: 10, p50: 100, p90: 200, p99: 300 + i as u64, p999: 400, max: 500 },
                );
                r
            })
            .collect();
        (scenario, results)
    }

    #[test]
    fn csv_has_a_row_per_point_and_a_column_per_field() {
        let (_, points) = results("workers");
        let text = csv(&points);
        let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(',').collect()).collect();
        assert_eq!(rows.len(), 1 + points.len());
        assert!(rows.iter().all(|r| r.len() == rows[0].len()));
        let col = |name: &str| rows[0].iter().position(|c| *c == name).unwrap();
        assert_eq!(rows[2][col("commands_per_s")], "2000.0");
        assert_eq!(rows[2][col("request_p99_us")], "301");
        assert!(!rows[0].contains(&"read_count"), "kinds no point measured have no columns");
        assert_eq!(rows[3][col("workers")], "2");
    }

    #[test]
    fn plots_have_one_line_per_series_and_every_point() {
        let (scenario, points) = results("workers");
        let svg = throughput_svg(&scenario, &scenario.sweeps, &points);
        assert_eq!(svg.matches("<polyline").count(), 2, "early and late-batch-bitmap");
        assert_eq!(svg.matches("<circle").count(), points.len());
        assert!(svg.contains("scheduler=early") && svg.contains("scheduler=late-batch-bitmap"));
        let (scenario, points) = results("schedulers");
        let svg = throughput_svg(&scenario, &scenario.sweeps, &points);
        assert!(svg.contains(">early-ws-optimistic</text>"), "scheduler names label the x axis");
        let lat = latency_svg(&scenario, &scenario.sweeps, &points);
        assert_eq!(lat.matches("<circle").count(), points.len());
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn the_report_says_where_parallel_schedulers_lack_cores() {
        let (scenario, mut points) = results("schedulers");
        // sequential at 1000/s; every other scheduler above it, but early
        // (2 workers each on 3 replicas, 2 cores) below.
        let early = points.iter().position(|p| p.name == "scheduler=early").unwrap();
        points[early].commands_per_s = 500.0;
        for p in &mut points {
            p.stages = vec![StageRow {
                replica: "r".into(),
                stage: "psmr-protocol".into(),
                busy: 0.5,
                waiting_cpu: 0.25,
                blocked: 0.25,
                threads: 3,
            }];
        }
        let md = markdown(&scenario, &scenario.sweeps, &points, Machine { cores: 2 });
        assert!(md.contains("This machine: 2 cores usable"), "{md}");
        let line = md.lines().find(|l| l.starts_with("| scheduler=early |") && l.contains("x |")).unwrap();
        assert!(line.contains("| 3 | 1 | 6 | 0.50x | loses to sequential for lack of cores"), "{line}");
        assert!(line.contains("without a CPU 25 %"), "{line}");
        let bitmap =
            md.lines().find(|l| l.starts_with("| scheduler=late-batch-bitmap |") && l.contains("x |")).unwrap();
        assert!(bitmap.contains("2.00x | 6 execution threads on 2 cores"), "{bitmap}");
        let seq = md.lines().find(|l| l.starts_with("| scheduler=sequential |") && l.contains(" - |")).unwrap();
        assert!(seq.ends_with("| 3 | - |  |"), "{seq}");
        let md = markdown(&scenario, &scenario.sweeps, &points, Machine { cores: 64 });
        let line = md.lines().find(|l| l.starts_with("| scheduler=early |") && l.contains("x |")).unwrap();
        assert!(line.ends_with("0.50x |  |"), "enough cores: no excuse: {line}");
    }

    #[test]
    fn the_report_names_every_point() {
        let (scenario, points) = results("latency-throughput");
        let md = markdown(&scenario, &scenario.sweeps, &points, Machine { cores: 2 });
        for p in &points {
            assert!(md.contains(&format!("| {} |", p.name)), "{}", p.name);
        }
        assert!(md.contains("Swept: clients=1,4,16,64; scheduler=sequential,early."));
        assert!(md.contains("| n/a | n/a |"), "no CPU figures measured");
        let mut with_cpu = points.clone();
        let replica = |id, role, us| ReplicaCpu {
            id,
            addr: format!("r{id}"),
            pid: Some(id as u32),
            role,
            cpu_s: Some(1.0),
            us_per_command: us,
            error: us.is_none().then(|| "process 3 exited or was replaced during the window".to_string()),
        };
        with_cpu[0].cpu = vec![
            replica(1, cpu::Role::Leader, Some(20.0)),
            replica(2, cpu::Role::Follower, Some(10.0)),
            replica(3, cpu::Role::Follower, None),
        ];
        with_cpu[1].cpu_note = Some("n/a: not local".into());
        let md = markdown(&scenario, &scenario.sweeps, &with_cpu, Machine { cores: 2 });
        assert!(md.contains("| 20.0 | 10.0 / 10.0 |"), "{md}");
        assert!(md.contains("replica 3: process 3 exited") && md.contains(": n/a: not local"), "{md}");
        let text = csv(&with_cpu);
        let row: Vec<&str> = text.lines().nth(1).unwrap().split(',').collect();
        let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
        let col = |name: &str| header.iter().position(|c| *c == name).unwrap();
        assert_eq!(row[col("cpu_us_per_cmd_leader")], "20.00");
        assert_eq!(row[col("cpu_us_per_cmd_followers_max")], "10.00");
    }

    #[test]
    fn axis_ends_are_round() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(7.0), 8.0);
        assert_eq!(nice_ceiling(9.0), 10.0);
        assert_eq!(nice_ceiling(130_000.0), 150_000.0);
        assert_eq!(nice_ceiling(208_400.0), 250_000.0);
        assert!((nice_ceiling(0.35) - 0.4).abs() < 1e-12);
        assert_eq!(short(250_000.0), "250k");
        assert_eq!(escape("a<b&"), "a&lt;b&amp;");
    }
}

#[derive(Serialize)]
struct SimulationResults<'a> {
    scenario: &'a str,
    source: &'a str,
    about: &'a str,
    seed: u64,
    cells: &'a [crate::simulate::Cell],
}

/// Writes the bitmap simulation's `results.json`, `results.csv`,
/// `conflict.svg` and `report.md` into `dir`. Returns the files.
pub fn write_simulation(
    dir: &Path,
    scenario: &Scenario,
    seed: u64,
    cells: &[crate::simulate::Cell],
) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let results =
        SimulationResults { scenario: scenario.name, source: scenario.source, about: scenario.about, seed, cells };
    let mut csv = String::from("bits,graph,batch,iterations,conflict_rate,expected_rate,paper_rate\n");
    for c in cells {
        let paper = c.paper_rate.map(|p| format!("{p:.4}")).unwrap_or_default();
        let _ = writeln!(
            csv,
            "{},{},{},{},{:.4},{:.4},{paper}",
            c.bits, c.graph, c.batch, c.iterations, c.conflict_rate, c.expected_rate
        );
    }
    // One line per (bits, batch) against the graph size, psmr's rate in
    // percent.
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for c in cells {
        let name = format!("{} bits, batch {}", c.bits, c.batch);
        let point = (c.graph as f64, 100.0 * c.conflict_rate);
        match lines.iter_mut().find(|(n, _)| *n == name) {
            Some((_, pts)) => pts.push(point),
            None => lines.push((name, vec![point])),
        }
    }
    let svg =
        chart(&format!("{}: conflict rate", scenario.name), "average graph size", "conflict rate (%)", &lines, &[]);
    let mut md = String::new();
    let _ = writeln!(md, "# psmr bench: {}\n", scenario.name);
    let _ = writeln!(md, "{}.\n", scenario.about);
    let _ = writeln!(md, "Follows: {}. Seed {seed}.\n", scenario.source);
    let _ = writeln!(md, "| bitmap bits | graph | batch | iterations | psmr | closed form | paper |");
    let _ = writeln!(md, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let pct = |v: f64| format!("{:.2} %", 100.0 * v);
    for c in cells {
        let paper = c.paper_rate.map_or("-".to_string(), pct);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {paper} |",
            c.bits,
            c.graph,
            c.batch,
            c.iterations,
            pct(c.conflict_rate),
            pct(c.expected_rate)
        );
    }
    let _ = writeln!(md, "\n![conflict rate](conflict.svg)");
    let files = vec![
        ("results.json", serde_json::to_string_pretty(&results).map_err(std::io::Error::other)? + "\n"),
        ("results.csv", csv),
        ("conflict.svg", svg),
        ("report.md", md),
    ];
    write_files(dir, files)
}
