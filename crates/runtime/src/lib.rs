//! corral-runtime (stub)
