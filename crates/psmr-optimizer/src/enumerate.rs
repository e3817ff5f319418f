//! The sequential/concurrent cases R.2 and R.3 allow.

use super::{bit, OptimizerError, Problem};

/// Each class's conflicts as a class mask, itself included when it has
/// internal conflicts.
pub(super) fn conflict_masks(problem: &Problem) -> Vec<u64> {
    (0..problem.model.len()).map(|c| problem.conflict_mask(c)).collect()
}

/// The sequential/concurrent choices R.2 and R.3 allow, as sequential-class
/// masks: self-conflicting classes always sequential, and no two
/// conflicting classes both concurrent.
pub(super) fn cases(problem: &Problem, limit: usize) -> Result<Vec<u64>, OptimizerError> {
    let n = problem.model.len();
    let conflict = conflict_masks(problem);
    let forced: u64 = (0..n).filter(|&c| conflict[c] & bit(c) != 0).fold(0, |m, c| m | bit(c));
    let free: Vec<usize> = (0..n).filter(|&c| forced & bit(c) == 0).collect();
    if free.len() >= usize::BITS as usize - 1 || 1usize << free.len() > limit {
        return Err(OptimizerError::TooManyCases { free: free.len(), max: limit });
    }
    let mut out = Vec::new();
    for choice in 0..1u64 << free.len() {
        // Bit i of `choice` set: free class i is sequential.
        let seq = free.iter().enumerate().filter(|(i, _)| choice & bit(*i) != 0).fold(forced, |m, (_, &c)| m | bit(c));
        let concurrent_conflict = (0..n).any(|c| seq & bit(c) == 0 && conflict[c] & !seq & !bit(c) != 0);
        if !concurrent_conflict {
            out.push(seq);
        }
    }
    Ok(out)
}
