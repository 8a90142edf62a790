//! Fake Azure ARM (Microsoft.Compute, Microsoft.Network) server: work in progress.
