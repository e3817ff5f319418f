//! A load's result for people and for scripts: what `psmr client load`
//! prints.

use super::{LoadResult, LoadSpec};
use std::fmt::Write as _;

impl LoadResult {
    /// Requests per second over the window.
    pub fn requests_per_s(&self) -> f64 {
        self.requests as f64 / self.seconds
    }

    /// Throughput, request latency and failures in one line, the CPU per
    /// command, and how busy each replica thread was, as text.
    pub fn format_summary(&self, spec: &LoadSpec) -> String {
        let l = &self.request_latency;
        let mut out = format!(
            "{} clients x {} commands/request: {:.0} commands/s, {:.0} requests/s, latency p50 {} us, p99 {} us, {} failed requests\n",
            spec.clients,
            spec.per_request,
            self.commands_per_s(),
            self.requests_per_s(),
            l.value_at_quantile(0.5),
            l.value_at_quantile(0.99),
            self.errors
        );
        let (leader, followers) = crate::cpu::cells(&self.cpu);
        let _ = writeln!(out, "cpu µs/command: leader {leader}, followers mean/max {followers}");
        if let Some(note) = &self.cpu_note {
            let _ = writeln!(out, "cpu: {note}");
        }
        let _ = writeln!(out, "{:<22} {:<16} {:>6} {:>8} {:>8}", "replica", "thread", "busy", "wait-cpu", "blocked");
        for s in &self.stages {
            let _ = writeln!(
                out,
                "{:<22} {:<16} {:>5.1}% {:>7.1}% {:>7.1}%",
                s.replica,
                s.stage,
                s.busy * 100.0,
                s.waiting_cpu * 100.0,
                s.blocked * 100.0
            );
        }
        out
    }

    /// The same as one JSON object: `clients`, `per_request`, `seconds`,
    /// `commands_per_s`, `requests_per_s`, `p50_us`, `p99_us`, `max_us`,
    /// `failed_requests`, `stages`, `cpu`, `cpu_note`.
    pub fn to_json(&self, spec: &LoadSpec) -> serde_json::Value {
        let stages: Vec<serde_json::Value> = self
            .stages
            .iter()
            .map(|s| {
                serde_json::json!({"replica": s.replica, "thread": s.stage, "busy": s.busy,
                "waiting_cpu": s.waiting_cpu, "blocked": s.blocked})
            })
            .collect();
        let l = &self.request_latency;
        serde_json::json!({"clients": spec.clients, "per_request": spec.per_request, "seconds": self.seconds,
            "commands_per_s": self.commands_per_s(), "requests_per_s": self.requests_per_s(),
            "p50_us": l.value_at_quantile(0.5), "p99_us": l.value_at_quantile(0.99), "max_us": l.max(),
            "failed_requests": self.errors, "stages": stages, "cpu": self.cpu, "cpu_note": self.cpu_note})
    }
}
