//! corral-testkit (stub)
