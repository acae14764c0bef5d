//! Scatter-gather buffer iteration (seed 004).
