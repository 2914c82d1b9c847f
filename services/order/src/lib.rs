//! order service
