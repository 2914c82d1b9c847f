//! Shared helpers of the system tests.
