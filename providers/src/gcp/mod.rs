//! GCP Compute Engine (REST v1): see the issue 27 brief. Work in progress.
