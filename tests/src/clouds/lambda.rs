//! Fake Lambda Cloud API server: work in progress.
