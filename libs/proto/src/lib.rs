//! gRPC contracts of the sagaworks services.
//!
//! One module per service, generated from `proto/` at build time. Clients and
//! servers of every service live here so that a caller depends on the contract,
//! never on the callee's crate.

pub mod inventory {
    pub mod v1 {
        tonic::include_proto!("sagaworks.inventory.v1");
    }
}

pub mod payment {
    pub mod v1 {
        tonic::include_proto!("sagaworks.payment.v1");
    }
}

pub mod order {
    pub mod v1 {
        tonic::include_proto!("sagaworks.order.v1");
    }
}

pub mod deadletter {
    pub mod v1 {
        tonic::include_proto!("sagaworks.deadletter.v1");
    }
}

/// Converts a UTC time into its protobuf form.
pub fn timestamp(t: chrono::DateTime<chrono::Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: t.timestamp(), nanos: t.timestamp_subsec_nanos() as i32 }
}

/// Converts a protobuf timestamp back into UTC time (`None` when out of range).
pub fn from_timestamp(t: &prost_types::Timestamp) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32)
}
