//! The bitmap false-positive simulation of 004 §VII-D (Table I): how often
//! the batch bitmaps of `late-batch-bitmap` report a conflict between
//! batches that share no key, for a bitmap size, a batch size and an
//! average dependency graph size.
//!
//! Keys are drawn from 10^9 distinct ones, so two batches almost never share
//! a key and nearly every detected conflict is a false positive, as in the
//! paper. Each key is placed with the hash of `psmr_model::KeyBitmap`, so the
//! simulation measures psmr's own bitmaps. A batch is kept as the sorted
//! list of its set bits rather than as the bitmap's words: two such lists
//! share an element exactly when `KeyBitmap::intersects` would say the
//! bitmaps meet, and it spares clearing a megabit per batch.

use psmr_model::{sorted_intersect, KeyBitmap};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::VecDeque;

/// Distinct keys the batches draw from (004 §VII-D).
pub const KEY_SPACE: u64 = 1_000_000_000;

/// Iterations per cell in the paper.
pub const PAPER_ITERATIONS: u64 = 1_000_000;

/// One cell of Table I.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cell {
    /// Bitmap size, bits.
    pub bits: u32,
    /// Average graph size: batches each new batch is compared with.
    pub graph: usize,
    /// Keys per batch.
    pub batch: usize,
    /// Iterations simulated.
    pub iterations: u64,
    /// Share of new batches that conflict with at least one in the graph.
    pub conflict_rate: f64,
    /// The same share from the closed form of [`expected_rate`].
    pub expected_rate: f64,
    /// What 004 Table I reports, when it has this cell.
    pub paper_rate: Option<f64>,
}

/// 004 Table I: (bits, graph, batch) and the conflict rate it reports.
pub const PAPER_TABLE: [(u32, usize, usize, f64); 12] = [
    (102_400, 1, 100, 0.0929),
    (102_400, 5, 100, 0.3869),
    (102_400, 7, 100, 0.4950),
    (1_024_000, 1, 100, 0.0096),
    (1_024_000, 5, 100, 0.0475),
    (1_024_000, 7, 100, 0.0661),
    (102_400, 1, 200, 0.3237),
    (102_400, 5, 200, 0.8585),
    (102_400, 7, 200, 0.9352),
    (1_024_000, 1, 200, 0.0385),
    (1_024_000, 5, 200, 0.1778),
    (1_024_000, 7, 200, 0.2395),
];

/// The sorted, distinct bits `batch` random keys set in a bitmap of `bits`.
fn batch_bits(rng: &mut ChaCha8Rng, bits: u32, batch: usize) -> Vec<u32> {
    let mut set: Vec<u32> = (0..batch).map(|_| KeyBitmap::bit_of(bits, rng.gen_range(0..KEY_SPACE))).collect();
    set.sort_unstable();
    set.dedup();
    set
}

/// Simulates `iterations` new batches of `batch` keys, each compared with
/// the `graph` batches before it, and returns the share that conflicts.
pub fn conflict_rate(bits: u32, batch: usize, graph: usize, iterations: u64, seed: u64) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut window: VecDeque<Vec<u32>> = (0..graph).map(|_| batch_bits(&mut rng, bits, batch)).collect();
    let mut conflicts = 0u64;
    for _ in 0..iterations {
        let new = batch_bits(&mut rng, bits, batch);
        if window.iter().any(|old| sorted_intersect(&new, old)) {
            conflicts += 1;
        }
        if graph > 0 {
            window.pop_front();
            window.push_back(new);
        }
    }
    conflicts as f64 / iterations.max(1) as f64
}

/// The closed form: a batch of `b` keys sets about `k = m (1 - (1 - 1/m)^b)`
/// of `m` bits; another batch misses all of them with probability
/// `(1 - k/m)^b`, and misses `g` independent batches with that to the `g`.
pub fn expected_rate(bits: u32, batch: usize, graph: usize) -> f64 {
    let m = f64::from(bits);
    let b = batch as f64;
    let k = m * (1.0 - (1.0 - 1.0 / m).powf(b));
    let miss_one = (1.0 - k / m).powf(b);
    1.0 - miss_one.powf(graph as f64)
}

/// Every cell of Table I with `iterations` each.
pub fn table(iterations: u64, seed: u64) -> Vec<Cell> {
    PAPER_TABLE
        .iter()
        .enumerate()
        .map(|(i, &(bits, graph, batch, paper))| Cell {
            bits,
            graph,
            batch,
            iterations,
            conflict_rate: conflict_rate(bits, batch, graph, iterations, seed.wrapping_add(i as u64)),
            expected_rate: expected_rate(bits, batch, graph),
            paper_rate: Some(paper),
        })
        .collect()
}

/// The cells as a readable table: psmr's rate, the closed form's and the
/// paper's (what `psmr bench --scenario bitmap-false-positives` prints).
pub fn format_table(cells: &[Cell]) -> String {
    let mut out = format!(
        "{:>12} {:>6} {:>6} {:>10} {:>12} {:>10}\n",
        "bitmap_bits", "graph", "batch", "psmr", "closed_form", "paper"
    );
    for c in cells {
        let paper = c.paper_rate.map_or("-".to_string(), |p| format!("{:.2}%", 100.0 * p));
        out += &format!(
            "{:>12} {:>6} {:>6} {:>9.2}% {:>11.2}% {:>10}\n",
            c.bits,
            c.graph,
            c.batch,
            100.0 * c.conflict_rate,
            100.0 * c.expected_rate,
            paper
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulation_agrees_with_the_closed_form() {
        // 20k iterations: the binomial standard deviation is at most 0.0036.
        for (bits, graph, batch, _) in PAPER_TABLE {
            let got = conflict_rate(bits, batch, graph, 20_000, 7);
            let want = expected_rate(bits, batch, graph);
            assert!((got - want).abs() < 0.02, "{bits} bits, graph {graph}, batch {batch}: {got} vs {want}");
        }
    }

    #[test]
    fn the_closed_form_matches_the_paper() {
        // Table I was simulated with 10^6 iterations; its numbers sit within
        // a point of the closed form.
        for (bits, graph, batch, paper) in PAPER_TABLE {
            let want = expected_rate(bits, batch, graph);
            assert!((paper - want).abs() < 0.01, "{bits} bits, graph {graph}, batch {batch}: {paper} vs {want}");
        }
    }

    #[test]
    fn no_graph_no_conflict_and_tiny_bitmaps_always_conflict() {
        assert_eq!(conflict_rate(1024, 100, 0, 1000, 1), 0.0);
        assert_eq!(conflict_rate(1, 1, 1, 1000, 1), 1.0);
    }
}
