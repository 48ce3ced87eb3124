//! Workflow data types (stub, owned by the workflow work).
