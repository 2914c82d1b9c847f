//! payment service
