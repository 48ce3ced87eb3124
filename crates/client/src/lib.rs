//! corral-client (stub)
