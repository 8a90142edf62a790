//! Azure Virtual Machines (ARM REST): see the issue 27 brief. Work in progress.
