//! codec (stub)
