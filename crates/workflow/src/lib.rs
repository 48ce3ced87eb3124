//! corral-workflow (stub)
