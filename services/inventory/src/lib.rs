//! inventory service
