//! sqlite (stub)
