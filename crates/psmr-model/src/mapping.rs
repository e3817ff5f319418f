//! The class-to-threads mapping of early scheduling (003 Def. 4, §4.4).

use crate::class::ClassModel;
use crate::command::ClassId;
use serde::{Deserialize, Serialize};
use std::fmt;
use thiserror::Error;

/// Most worker threads a mapping may name. Thread sets are kept as 64-bit
/// masks on the scheduler's hot path.
pub const WORKERS_MAX: usize = 64;

/// Synchronization mode of a class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every thread of the class receives each command; the threads meet at
    /// the class barrier and the lowest-numbered one executes it.
    Sequential,
    /// Each command goes to one thread of the class, round-robin.
    Concurrent,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Sequential => "sequential",
            Mode::Concurrent => "concurrent",
        })
    }
}

/// Mode and threads of one class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassMapping {
    /// Sequential or concurrent.
    pub mode: Mode,
    /// Worker ids, sorted and without duplicates.
    pub threads: Vec<usize>,
}

impl ClassMapping {
    /// A class mapping; `threads` is sorted and deduplicated.
    pub fn new(mode: Mode, threads: impl IntoIterator<Item = usize>) -> Self {
        let mut threads: Vec<usize> = threads.into_iter().collect();
        threads.sort_unstable();
        threads.dedup();
        Self { mode, threads }
    }

    /// The threads as a bit mask (bit `t` set for thread `t`; threads past
    /// [`WORKERS_MAX`] are dropped, which validation reports first).
    pub fn thread_mask(&self) -> u64 {
        self.threads.iter().filter(|&&t| t < WORKERS_MAX).fold(0, |m, &t| m | (1u64 << t))
    }
}

/// Errors found in a mapping: which rule of 003 §4.4 is broken and where.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum MappingError {
    /// The mapping does not cover the model's classes one for one.
    #[error("mapping has {got} classes but class model {model} has {want}")]
    ClassCount {
        /// Class model name.
        model: String,
        /// Classes in the mapping.
        got: usize,
        /// Classes in the model.
        want: usize,
    },
    /// Worker count outside `1..=WORKERS_MAX`.
    #[error("a mapping needs between 1 and {max} workers, got {0}", max = WORKERS_MAX)]
    Workers(usize),
    /// A class names a thread the replica does not have.
    #[error("class {class} uses thread {thread} but there are only {workers} workers (threads 0..{workers})")]
    ThreadOutOfRange {
        /// The class.
        class: String,
        /// The thread it names.
        thread: usize,
        /// Number of workers.
        workers: usize,
    },
    /// R.1: every class has at least one thread.
    #[error("rule R.1 broken: class {class} has no thread")]
    R1 {
        /// The class without threads.
        class: String,
    },
    /// R.2: a class with internal conflicts must be sequential.
    #[error("rule R.2 broken: class {class} conflicts with itself but is concurrent")]
    R2 {
        /// The class.
        class: String,
    },
    /// R.3: of two conflicting classes at least one is sequential.
    #[error("rule R.3 broken: classes {a} and {b} conflict but both are concurrent")]
    R3 {
        /// One class.
        a: String,
        /// The other class.
        b: String,
    },
    /// R.4: a concurrent class's threads are a subset of every sequential
    /// class it conflicts with.
    #[error("rule R.4 broken: concurrent class {concurrent} conflicts with sequential class {sequential}, but threads {missing:?} of {concurrent} are not threads of {sequential}")]
    R4 {
        /// The sequential class.
        sequential: String,
        /// The concurrent class.
        concurrent: String,
        /// Threads of the concurrent class missing from the sequential one.
        missing: Vec<usize>,
    },
    /// R.5: two conflicting sequential classes share a thread.
    #[error("rule R.5 broken: sequential classes {a} and {b} conflict but share no thread")]
    R5 {
        /// One class.
        a: String,
        /// The other class.
        b: String,
    },
    /// A mapping file or spec names a class the model does not have.
    #[error("mapping names unknown class {class:?} (model {model} has {known})")]
    UnknownClass {
        /// The unknown name.
        class: String,
        /// The model.
        model: String,
        /// The model's classes, comma-separated.
        known: String,
    },
    /// A class of the model is missing from a mapping file or spec.
    #[error("mapping does not mention class {0}")]
    MissingClass(String),
    /// A class appears twice in a mapping file or spec.
    #[error("mapping mentions class {0} twice")]
    DuplicateClass(String),
    /// Malformed mapping text.
    #[error("malformed mapping: {0}")]
    Parse(String),
}

/// The class-to-threads mapping (003 Def. 4): for each class of a
/// [`ClassModel`], its mode and its threads, for a fixed number of workers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    workers: usize,
    classes: Vec<ClassMapping>,
}

#[derive(Serialize, Deserialize)]
struct JsonMapping {
    classes: Vec<JsonClass>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    objective: Option<f64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonClass {
    name: String,
    mode: Mode,
    threads: Vec<usize>,
}

impl Mapping {
    /// A mapping for `workers` threads, one entry per class in id order.
    /// Not validated: call [`Mapping::validate`].
    pub fn new(workers: usize, classes: Vec<ClassMapping>) -> Self {
        Self { workers, classes }
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The entry of a class.
    pub fn class(&self, c: ClassId) -> &ClassMapping {
        &self.classes[c.index()]
    }

    /// All entries, in class id order.
    pub fn classes(&self) -> &[ClassMapping] {
        &self.classes
    }

    /// Checks rules R.1-R.5 of 003 §4.4 against `model`; the error names
    /// the rule and the classes involved.
    pub fn validate(&self, model: &ClassModel) -> Result<(), MappingError> {
        if self.workers == 0 || self.workers > WORKERS_MAX {
            return Err(MappingError::Workers(self.workers));
        }
        if self.classes.len() != model.len() {
            return Err(MappingError::ClassCount {
                model: model.name().to_string(),
                got: self.classes.len(),
                want: model.len(),
            });
        }
        let name = |c: ClassId| model.class_name(c).to_string();
        for c in model.class_ids() {
            let m = self.class(c);
            if let Some(&t) = m.threads.iter().find(|&&t| t >= self.workers) {
                return Err(MappingError::ThreadOutOfRange { class: name(c), thread: t, workers: self.workers });
            }
            if m.threads.is_empty() {
                return Err(MappingError::R1 { class: name(c) });
            }
            if model.self_conflicting(c) && m.mode != Mode::Sequential {
                return Err(MappingError::R2 { class: name(c) });
            }
        }
        for a in model.class_ids() {
            for b in model.class_ids().filter(|&b| b > a && model.conflicts(a, b)) {
                let (ma, mb) = (self.class(a), self.class(b));
                match (ma.mode, mb.mode) {
                    (Mode::Concurrent, Mode::Concurrent) => return Err(MappingError::R3 { a: name(a), b: name(b) }),
                    (Mode::Sequential, Mode::Sequential) => {
                        if ma.thread_mask() & mb.thread_mask() == 0 {
                            return Err(MappingError::R5 { a: name(a), b: name(b) });
                        }
                    }
                    (sa, _) => {
                        let (s, c) = if sa == Mode::Sequential { (a, b) } else { (b, a) };
                        let (ms, mc) = (self.class(s), self.class(c));
                        let missing: Vec<usize> =
                            mc.threads.iter().copied().filter(|t| !ms.threads.contains(t)).collect();
                        if !missing.is_empty() {
                            return Err(MappingError::R4 { sequential: name(s), concurrent: name(c), missing });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Parses the JSON form
    /// `{"classes":[{"name":"W","mode":"sequential","threads":[0,1]},...]}`
    /// (an `"objective"` field is accepted and ignored) and validates it.
    pub fn from_json(model: &ClassModel, workers: usize, text: &str) -> Result<Self, MappingError> {
        let parsed: JsonMapping = serde_json::from_str(text).map_err(|e| MappingError::Parse(e.to_string()))?;
        let entries = parsed.classes.into_iter().map(|c| (c.name, ClassMapping::new(c.mode, c.threads)));
        Self::from_named(model, workers, entries)
    }

    /// Parses the compact form `R=conc:0,1;W=seq:0-3` (modes `seq`,
    /// `sequential`, `conc`, `concurrent`; threads as a comma-separated list
    /// of ids and inclusive ranges) and validates it.
    pub fn from_spec(model: &ClassModel, workers: usize, text: &str) -> Result<Self, MappingError> {
        let mut entries = Vec::new();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, rest) = part
                .split_once('=')
                .ok_or_else(|| MappingError::Parse(format!("expected CLASS=MODE:THREADS, got {part:?}")))?;
            let (mode, threads) = rest
                .split_once(':')
                .ok_or_else(|| MappingError::Parse(format!("expected MODE:THREADS after {name}=, got {rest:?}")))?;
            let mode = match mode.trim() {
                "seq" | "sequential" => Mode::Sequential,
                "conc" | "concurrent" => Mode::Concurrent,
                other => {
                    return Err(MappingError::Parse(format!("unknown mode {other:?} for class {name} (seq or conc)")))
                }
            };
            entries.push((name.trim().to_string(), ClassMapping::new(mode, parse_threads(threads)?)));
        }
        Self::from_named(model, workers, entries)
    }

    fn from_named(
        model: &ClassModel,
        workers: usize,
        entries: impl IntoIterator<Item = (String, ClassMapping)>,
    ) -> Result<Self, MappingError> {
        let mut slots: Vec<Option<ClassMapping>> = vec![None; model.len()];
        for (name, m) in entries {
            let c = model.class_id(&name).ok_or_else(|| MappingError::UnknownClass {
                class: name.clone(),
                model: model.name().to_string(),
                known: model.class_ids().map(|c| model.class_name(c)).collect::<Vec<_>>().join(","),
            })?;
            if slots[c.index()].replace(m).is_some() {
                return Err(MappingError::DuplicateClass(name));
            }
        }
        let classes = slots
            .into_iter()
            .enumerate()
            .map(|(i, s)| s.ok_or_else(|| MappingError::MissingClass(model.class_name(ClassId(i as u16)).to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let mapping = Self { workers, classes };
        mapping.validate(model)?;
        Ok(mapping)
    }

    /// The JSON form read by [`Mapping::from_json`].
    pub fn to_json(&self, model: &ClassModel) -> String {
        let classes = model
            .class_ids()
            .map(|c| JsonClass {
                name: model.class_name(c).to_string(),
                mode: self.class(c).mode,
                threads: self.class(c).threads.clone(),
            })
            .collect();
        serde_json::to_string(&JsonMapping { classes, objective: None }).expect("mapping serializes")
    }

    /// The compact form read by [`Mapping::from_spec`], with runs of
    /// consecutive threads as ranges: `R=conc:0-1;W=seq:0-3`.
    pub fn to_spec(&self, model: &ClassModel) -> String {
        let mut parts = Vec::with_capacity(model.len());
        for c in model.class_ids() {
            let m = self.class(c);
            let mode = match m.mode {
                Mode::Sequential => "seq",
                Mode::Concurrent => "conc",
            };
            let mut runs: Vec<String> = Vec::new();
            let mut threads = m.threads.iter().copied().peekable();
            while let Some(first) = threads.next() {
                let mut last = first;
                while threads.peek() == Some(&(last + 1)) {
                    last = threads.next().unwrap_or(last);
                }
                runs.push(if first == last { first.to_string() } else { format!("{first}-{last}") });
            }
            parts.push(format!("{}={mode}:{}", model.class_name(c), runs.join(",")));
        }
        parts.join(";")
    }

    /// A table like 000 Table 4.1: one row per class, its mode, and an `x`
    /// under each of its threads.
    pub fn table(&self, model: &ClassModel) -> String {
        let width = model.class_ids().map(|c| model.class_name(c).len()).max().unwrap_or(1).max(5);
        let mut out = format!("{:width$}  {:10}", "class", "mode");
        for t in 0..self.workers {
            out.push_str(&format!(" {:>3}", format!("t{t}")));
        }
        out.push('\n');
        for c in model.class_ids() {
            let m = self.class(c);
            out.push_str(&format!("{:width$}  {:10}", model.class_name(c), m.mode.to_string()));
            for t in 0..self.workers {
                out.push_str(if m.threads.contains(&t) { "   x" } else { "   ." });
            }
            out.push('\n');
        }
        out
    }
}

fn parse_threads(text: &str) -> Result<Vec<usize>, MappingError> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let num = |s: &str| {
            s.trim()
                .trim_start_matches('t')
                .parse::<usize>()
                .map_err(|_| MappingError::Parse(format!("bad thread id {s:?}")))
        };
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b || b >= WORKERS_MAX {
                    return Err(MappingError::Parse(format!("bad thread range {item:?}")));
                }
                out.extend(a..=b);
            }
            None => out.push(num(item)?),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fig. 1(c) of 003 with two shards.
    fn sharded2() -> ClassModel {
        let mut b = ClassModel::builder("sharded-global");
        for c in ["R1", "R2", "W1", "W2", "Rg", "Wg"] {
            b = b.class(c);
        }
        b.conflict("R1", "W1")
            .conflict("R2", "W2")
            .conflict("W1", "W1")
            .conflict("W2", "W2")
            .conflict("Rg", "W1")
            .conflict("Rg", "W2")
            .conflict("Wg", "Wg")
            .conflict("Wg", "R1")
            .conflict("Wg", "R2")
            .conflict("Wg", "W1")
            .conflict("Wg", "W2")
            .conflict("Wg", "Rg")
            .build()
            .unwrap()
    }

    const TABLE_4_1: &str = "R1=conc:0,2; R2=conc:1,3; W1=seq:0,2; W2=seq:1,3; Rg=seq:0,3; Wg=seq:0-3";

    #[test]
    fn table_4_1_is_valid() {
        let m = Mapping::from_spec(&sharded2(), 4, TABLE_4_1).unwrap();
        assert_eq!(m.class(ClassId(5)).threads, vec![0, 1, 2, 3]);
        let back = Mapping::from_json(&sharded2(), 4, &m.to_json(&sharded2())).unwrap();
        assert_eq!(Mapping::from_spec(&sharded2(), 4, &m.to_spec(&sharded2())).unwrap(), m);
        assert_eq!(back, m);
        assert!(m.table(&sharded2()).contains("Wg     sequential   x   x   x   x"));
    }

    fn broken(spec: &str) -> MappingError {
        Mapping::from_spec(&sharded2(), 4, spec).unwrap_err()
    }

    #[test]
    fn each_rule_is_caught_and_named() {
        let e = broken("R1=conc:; R2=conc:1,3; W1=seq:0,2; W2=seq:1,3; Rg=seq:0,3; Wg=seq:0-3");
        assert_eq!(e, MappingError::R1 { class: "R1".into() });
        let e = broken("R1=conc:0,2; R2=conc:1,3; W1=conc:0,2; W2=seq:1,3; Rg=seq:0,3; Wg=seq:0-3");
        assert_eq!(e, MappingError::R2 { class: "W1".into() });
        assert!(e.to_string().starts_with("rule R.2 broken"));
        // R.3 needs two conflicting classes that may both be concurrent.
        let m = ClassModel::builder("ab").class("A").class("B").conflict("A", "B").build().unwrap();
        let e = Mapping::from_spec(&m, 2, "A=conc:0;B=conc:0").unwrap_err();
        assert_eq!(e, MappingError::R3 { a: "A".into(), b: "B".into() });
        let e = broken("R1=conc:0,2; R2=conc:1,3; W1=seq:0; W2=seq:1,3; Rg=seq:0,3; Wg=seq:0-3");
        assert_eq!(e, MappingError::R4 { sequential: "W1".into(), concurrent: "R1".into(), missing: vec![2] });
        assert!(e.to_string().contains("R.4"));
        let e = broken("R1=conc:0,2; R2=conc:1,3; W1=seq:0,2; W2=seq:1,3; Rg=seq:0; Wg=seq:0-3");
        assert_eq!(e, MappingError::R5 { a: "W2".into(), b: "Rg".into() });
    }

    #[test]
    fn malformed_mappings_are_rejected() {
        assert!(matches!(broken("R1=conc:0,2"), MappingError::MissingClass(_)));
        assert!(matches!(broken("X=conc:0"), MappingError::UnknownClass { .. }));
        assert!(matches!(broken("R1=fast:0"), MappingError::Parse(_)));
        assert!(matches!(broken("R1=conc:a"), MappingError::Parse(_)));
        assert!(matches!(broken("R1"), MappingError::Parse(_)));
        assert!(matches!(broken(&format!("{TABLE_4_1};R1=conc:0")), MappingError::DuplicateClass(_)));
        let e = broken("R1=conc:0,9; R2=conc:1,3; W1=seq:0,2; W2=seq:1,3; Rg=seq:0,3; Wg=seq:0-3");
        assert!(matches!(e, MappingError::ThreadOutOfRange { thread: 9, .. }));
        assert!(matches!(Mapping::from_json(&sharded2(), 4, "{\"classes\": 3}"), Err(MappingError::Parse(_))));
        assert!(matches!(Mapping::from_spec(&sharded2(), 0, TABLE_4_1), Err(MappingError::Workers(0))));
    }
}
