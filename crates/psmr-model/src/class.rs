//! Request classes and their conflict relation (003 Def. 2-3).

use crate::command::{ClassId, ClientId, Command, Key};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use thiserror::Error;

/// Errors building a [`ClassModel`].
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ClassModelError {
    /// Two classes have the same name.
    #[error("class {0:?} is declared twice")]
    DuplicateClass(String),
    /// A conflict names a class that was not declared.
    #[error("conflict names unknown class {0:?}")]
    UnknownClass(String),
    /// The model has no class.
    #[error("a class model needs at least one class")]
    Empty,
    /// More classes than a [`ClassId`] can number.
    #[error("too many classes: {0} (at most {max})", max = u16::MAX)]
    TooMany(usize),
    /// A model file is not the JSON [`ClassModel::from_json`] reads.
    #[error("bad class model JSON: {0}")]
    Parse(String),
}

/// The JSON form of a class model, as read by [`ClassModel::from_json`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonModel {
    #[serde(default)]
    name: String,
    classes: Vec<String>,
    #[serde(default)]
    conflicts: Vec<(String, String)>,
}

/// Request classes and the classes each conflicts with (003 Def. 2).
///
/// A class that conflicts with itself has *internal conflicts*: its commands
/// must run in log order among themselves. Conflicts between different
/// classes are *external*. The relation is symmetric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassModel {
    name: String,
    classes: Vec<String>,
    conflicts: Vec<Vec<bool>>,
}

/// Builder for [`ClassModel`]: declare classes, then conflicts between them.
#[derive(Debug, Default)]
pub struct ClassModelBuilder {
    name: String,
    classes: Vec<String>,
    conflicts: Vec<(String, String)>,
    global: Vec<String>,
}

impl ClassModelBuilder {
    /// Declares a class; its [`ClassId`] is its position of declaration.
    pub fn class(mut self, name: impl Into<String>) -> Self {
        self.classes.push(name.into());
        self
    }

    /// Declares that classes `a` and `b` conflict (`a == b`: internal conflict).
    pub fn conflict(mut self, a: impl Into<String>, b: impl Into<String>) -> Self {
        self.conflicts.push((a.into(), b.into()));
        self
    }

    /// Declares that class `a` conflicts with every class of the model,
    /// itself included (a command that may touch anything).
    pub fn conflicts_with_all(mut self, a: impl Into<String>) -> Self {
        self.global.push(a.into());
        self
    }

    /// Checks names and builds the model.
    pub fn build(mut self) -> Result<ClassModel, ClassModelError> {
        for a in std::mem::take(&mut self.global) {
            let all: Vec<(String, String)> = self.classes.iter().map(|b| (a.clone(), b.clone())).collect();
            self.conflicts.extend(all);
            // Named even when the class list lacks it, so that build
            // reports the unknown class.
            self.conflicts.push((a.clone(), a));
        }
        if self.classes.is_empty() {
            return Err(ClassModelError::Empty);
        }
        if self.classes.len() > usize::from(u16::MAX) {
            return Err(ClassModelError::TooMany(self.classes.len()));
        }
        let mut index = HashMap::new();
        for (i, c) in self.classes.iter().enumerate() {
            if index.insert(c.clone(), i).is_some() {
                return Err(ClassModelError::DuplicateClass(c.clone()));
            }
        }
        let n = self.classes.len();
        let mut conflicts = vec![vec![false; n]; n];
        for (a, b) in &self.conflicts {
            let ia = *index.get(a).ok_or_else(|| ClassModelError::UnknownClass(a.clone()))?;
            let ib = *index.get(b).ok_or_else(|| ClassModelError::UnknownClass(b.clone()))?;
            conflicts[ia][ib] = true;
            conflicts[ib][ia] = true;
        }
        Ok(ClassModel { name: self.name, classes: self.classes, conflicts })
    }
}

impl ClassModel {
    /// Starts a model called `name` (for messages and tables).
    pub fn builder(name: impl Into<String>) -> ClassModelBuilder {
        ClassModelBuilder { name: name.into(), ..Default::default() }
    }

    /// Reads a model from JSON:
    /// `{"name":"kv","classes":["R","W"],"conflicts":[["R","W"],["W","W"]]}`.
    ///
    /// `name` is optional; a pair `[A, A]` declares internal conflicts of
    /// `A`. A conflict naming an undeclared class is an error, as is a class
    /// declared twice.
    pub fn from_json(text: &str) -> Result<Self, ClassModelError> {
        let parsed: JsonModel = serde_json::from_str(text).map_err(|e| ClassModelError::Parse(e.to_string()))?;
        let mut builder = ClassModel::builder(parsed.name);
        for class in parsed.classes {
            builder = builder.class(class);
        }
        for (a, b) in parsed.conflicts {
            builder = builder.conflict(a, b);
        }
        builder.build()
    }

    /// The JSON form read by [`ClassModel::from_json`]; each conflicting
    /// pair appears once, the lower class id first.
    pub fn to_json(&self) -> String {
        let mut conflicts = Vec::new();
        for a in 0..self.classes.len() {
            for b in a..self.classes.len() {
                if self.conflicts[a][b] {
                    conflicts.push((self.classes[a].clone(), self.classes[b].clone()));
                }
            }
        }
        let json = JsonModel { name: self.name.clone(), classes: self.classes.clone(), conflicts };
        serde_json::to_string(&json).expect("class model serializes")
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of classes.
    pub fn len(&self) -> usize {
        self.classes.len()
    }

    /// Always false: a model has at least one class.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    /// The classes, in id order.
    pub fn class_ids(&self) -> impl Iterator<Item = ClassId> + '_ {
        (0..self.classes.len()).map(|i| ClassId(i as u16))
    }

    /// Name of a class. Panics on an id outside the model (a programming error).
    pub fn class_name(&self, c: ClassId) -> &str {
        &self.classes[c.index()]
    }

    /// Looks a class up by name.
    pub fn class_id(&self, name: &str) -> Option<ClassId> {
        self.classes.iter().position(|c| c == name).map(|i| ClassId(i as u16))
    }

    /// True when the classes conflict (for `a == b`: internal conflicts).
    pub fn conflicts(&self, a: ClassId, b: ClassId) -> bool {
        self.conflicts[a.index()][b.index()]
    }

    /// True when the class conflicts with itself.
    pub fn self_conflicting(&self, c: ClassId) -> bool {
        self.conflicts(c, c)
    }

    /// Checks a class model against commands (003 Def. 3): every pair of
    /// distinct conflicting commands must belong to conflicting classes.
    /// Reports the first pair the model misses.
    ///
    /// Runs in time linear in the total number of keys touched: commands are
    /// grouped per key and, per key, per (class, writes?) with up to two
    /// witnesses each, which is enough to find a pair of distinct commands.
    pub fn check_commands<'a, O: 'a>(
        &self,
        commands: impl IntoIterator<Item = &'a Command<O>>,
    ) -> Result<(), MissedConflict> {
        // key -> (class, writes) -> up to two command refs
        let mut by_key: HashMap<Key, HashMap<(ClassId, bool), Witnesses>> = HashMap::new();
        for (i, c) in commands.into_iter().enumerate() {
            let r = CommandRef { client: c.client, seq: c.seq, class: self.class_label(c.class) };
            let keys = c.writes.iter().map(|k| (k, true)).chain(c.reads.iter().map(|k| (k, false)));
            for (k, w) in keys {
                let slot = by_key.entry(*k).or_default().entry((c.class, w)).or_default();
                if slot.len() < 2 && slot.last().map(|s| s.0) != Some(i) {
                    slot.push((i, r.clone()));
                }
            }
        }
        let mut keys: Vec<_> = by_key.into_iter().collect();
        keys.sort_unstable_by_key(|(k, _)| *k);
        for (key, groups) in keys {
            let mut groups: Vec<_> = groups.into_iter().collect();
            groups.sort_unstable_by_key(|(g, _)| *g);
            for (x, ((ca, wa), refs_a)) in groups.iter().enumerate() {
                for ((cb, wb), refs_b) in &groups[x..] {
                    if !(*wa || *wb) || self.class_in_range(*ca, *cb) && self.conflicts(*ca, *cb) {
                        continue;
                    }
                    let pair = refs_a.iter().find_map(|a| refs_b.iter().find(|b| b.0 != a.0).map(|b| (a, b)));
                    if let Some((a, b)) = pair {
                        // Name the two commands in log order.
                        let (a, b) = if a.0 <= b.0 { (a, b) } else { (b, a) };
                        return Err(MissedConflict { first: a.1.clone(), second: b.1.clone(), key });
                    }
                }
            }
        }
        Ok(())
    }

    fn class_in_range(&self, a: ClassId, b: ClassId) -> bool {
        a.index() < self.len() && b.index() < self.len()
    }

    fn class_label(&self, c: ClassId) -> String {
        self.classes.get(c.index()).cloned().unwrap_or_else(|| format!("#{}", c.0))
    }
}

/// Up to two (position, command) witnesses of one (class, writes?) group.
type Witnesses = Vec<(usize, CommandRef)>;

/// A command, named for error messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandRef {
    /// The client that sent it.
    pub client: ClientId,
    /// Its sequence number.
    pub seq: u64,
    /// Its class name.
    pub class: String,
}

impl fmt::Display for CommandRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "command (client {}, seq {}, class {})", self.client, self.seq, self.class)
    }
}

/// Two conflicting commands whose classes the model says do not conflict.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("class model misses a conflict on key {key}: {first} and {second} conflict but their classes do not")]
pub struct MissedConflict {
    /// One of the commands.
    pub first: CommandRef,
    /// The other command.
    pub second: CommandRef,
    /// A key both touch, written by at least one of them.
    pub key: Key,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw() -> ClassModel {
        ClassModel::builder("rw").class("R").class("W").conflict("R", "W").conflict("W", "W").build().unwrap()
    }

    fn cmd(seq: u64, class: u16, reads: &[Key], writes: &[Key]) -> Command<()> {
        Command {
            client: ClientId(1),
            seq,
            class: ClassId(class),
            reads: reads.iter().copied().collect(),
            writes: writes.iter().copied().collect(),
            op: (),
            stamp: Default::default(),
        }
    }

    #[test]
    fn a_class_in_conflict_with_all_conflicts_with_every_class_and_itself() {
        let m = ClassModel::builder("x").class("A").class("B").class("G").conflicts_with_all("G").build().unwrap();
        let (a, b, g) = (ClassId(0), ClassId(1), ClassId(2));
        assert!(m.conflicts(g, a) && m.conflicts(b, g) && m.self_conflicting(g));
        assert!(!m.conflicts(a, b) && !m.self_conflicting(a));
        let e = ClassModel::builder("x").class("A").conflicts_with_all("H").build();
        assert_eq!(e, Err(ClassModelError::UnknownClass("H".into())));
    }

    #[test]
    fn builder_rejects_bad_names() {
        assert_eq!(
            ClassModel::builder("x").class("A").conflict("A", "B").build(),
            Err(ClassModelError::UnknownClass("B".into()))
        );
        assert_eq!(
            ClassModel::builder("x").class("A").class("A").build(),
            Err(ClassModelError::DuplicateClass("A".into()))
        );
        assert_eq!(ClassModel::builder("x").build(), Err(ClassModelError::Empty));
    }

    #[test]
    fn json_round_trips_and_rejects_bad_models() {
        let m = rw();
        assert_eq!(ClassModel::from_json(&m.to_json()).unwrap(), m);
        let parsed = ClassModel::from_json(r#"{"classes":["A","B"],"conflicts":[["B","A"]]}"#).unwrap();
        assert!(parsed.conflicts(ClassId(0), ClassId(1)) && !parsed.self_conflicting(ClassId(0)));
        assert_eq!(
            ClassModel::from_json(r#"{"classes":["A"],"conflicts":[["A","Z"]]}"#),
            Err(ClassModelError::UnknownClass("Z".into()))
        );
        assert_eq!(ClassModel::from_json(r#"{"classes":[]}"#), Err(ClassModelError::Empty));
        for bad in ["", "[]", r#"{"classes":["A"],"extra":1}"#, r#"{"classes":["A"],"conflicts":[["A"]]}"#] {
            assert!(matches!(ClassModel::from_json(bad), Err(ClassModelError::Parse(_))), "{bad:?}");
        }
    }

    #[test]
    fn relation_is_symmetric() {
        let m = rw();
        let (r, w) = (m.class_id("R").unwrap(), m.class_id("W").unwrap());
        assert!(m.conflicts(r, w) && m.conflicts(w, r) && m.self_conflicting(w));
        assert!(!m.self_conflicting(r));
    }

    #[test]
    fn checker_accepts_a_correct_model() {
        let cmds = vec![cmd(1, 0, &[1], &[]), cmd(2, 1, &[], &[1]), cmd(3, 0, &[1], &[]), cmd(4, 1, &[], &[1])];
        assert_eq!(rw().check_commands(&cmds), Ok(()));
    }

    #[test]
    fn checker_finds_a_missed_internal_conflict() {
        // A "reader" class whose commands actually write.
        let cmds = vec![cmd(1, 0, &[], &[7]), cmd(2, 0, &[7], &[])];
        let err = rw().check_commands(&cmds).unwrap_err();
        assert_eq!((err.first.seq, err.second.seq, err.key), (1, 2, 7));
        assert!(err.to_string().contains("class R"), "{err}");
    }

    #[test]
    fn checker_finds_a_missed_external_conflict() {
        let m = ClassModel::builder("x").class("A").class("B").conflict("A", "A").build().unwrap();
        let cmds = vec![cmd(1, 0, &[], &[3]), cmd(2, 1, &[3], &[])];
        let err = m.check_commands(&cmds).unwrap_err();
        assert_eq!((err.first.class.as_str(), err.second.class.as_str()), ("A", "B"));
    }

    #[test]
    fn a_command_does_not_conflict_with_itself() {
        let m = ClassModel::builder("x").class("A").build().unwrap();
        let cmds = vec![cmd(1, 0, &[5], &[5])];
        assert_eq!(m.check_commands(&cmds), Ok(()));
    }
}
