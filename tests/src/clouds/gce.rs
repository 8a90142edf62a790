//! Fake GCE (compute v1) server: work in progress.
