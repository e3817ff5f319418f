//! # psmr-harness: checking clusters from outside
//!
//! What judges a psmr cluster by what its clients saw, whoever ran it (a
//! benchmark against real processes, the deterministic simulator):
//! client histories and the linearizability checker ([`history`]).
//! It depends on no part of a replica.

pub mod history;
