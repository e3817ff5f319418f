//! How late the protocol thread's timed wait wakes up: the batching delay
//! is a deadline of `Select::select_deadline` on the thread's queues, and
//! `batch_delay_us` is honoured to within this lateness. Prints
//! percentiles for a few delays, with Linux's default timer slack (50 µs)
//! and with the 1 µs slack the protocol thread sets.
//!
//! `cargo bench -p psmr-replica --bench deadline`

use crossbeam::channel::{bounded, Select};
use std::time::{Duration, Instant};

fn lateness(delay: Duration, rounds: usize) -> Vec<Duration> {
    let (_tx, rx) = bounded::<()>(1);
    let mut late = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let deadline = Instant::now() + delay;
        let mut sel = Select::new();
        sel.recv(&rx);
        let _ = sel.select_deadline(deadline);
        late.push(Instant::now().saturating_duration_since(deadline));
    }
    late.sort_unstable();
    late
}

fn at(sorted: &[Duration], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6
}

fn main() {
    println!("{:>10} {:>8} {:>12} {:>12} {:>12}", "slack", "delay", "p50 late µs", "p99 late µs", "max late µs");
    for slack_ns in [50_000u64, 1_000] {
        #[cfg(target_os = "linux")]
        nix::sys::prctl::set_timerslack(slack_ns).expect("prctl");
        for delay_us in [50, 200, 1_000] {
            let late = lateness(Duration::from_micros(delay_us), 2_000);
            println!(
                "{:>8}ns {:>6}µs {:>12.1} {:>12.1} {:>12.1}",
                slack_ns,
                delay_us,
                at(&late, 0.5),
                at(&late, 0.99),
                at(&late, 1.0)
            );
        }
    }
}
