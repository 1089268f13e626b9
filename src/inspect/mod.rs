//! Read-only views of a model and this machine for a person deciding how to
//! run: `plan` (where a model would go under a budget), `doctor` (readiness
//! checks, each with its fix) and `status` (a one-screen summary).

pub mod disk;
pub mod doctor;
pub mod plan;
pub mod status;
