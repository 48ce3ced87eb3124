//! corral-server (stub)
