//! Lambda Cloud (REST, API key): see the issue 27 brief. Work in progress.
