//! The saga's participants, inventory and payment, over gRPC with the workspace's
//! generated clients: mutual TLS as the order service (its certificate, checked against
//! the services' CA; the server's certificate must name the participant), as
//! `sagaworks_resilience::channel` connects the order service.

use crate::settings::Settings;
use sagaworks_mtls::{Identity, TlsError};
use sagaworks_proto::inventory::v1::inventory_service_client::InventoryServiceClient;
use sagaworks_proto::payment::v1::payment_service_client::PaymentServiceClient;
use sagaworks_saga::is_rejection;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::time::Duration;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

/// The identity the peer stands in for: the participants' allow-lists admit its calls.
pub const CALLER: &str = "order";

/// Per-attempt deadline of a participant call (the order service's `timeout_ms`).
pub const ATTEMPT: Duration = Duration::from_secs(2);

/// How long a connection attempt may take.
const CONNECT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ParticipantsError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("{participant}: {address:?} is no address: {reason}")]
    Address { participant: &'static str, address: String, reason: String },
}

/// A participant's answer that settles a step: done, or a business refusal (final, not
/// retried: the saga compensates).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Answer<T> {
    Done(T),
    Rejected(String),
}

/// A call that settled nothing (transport, deadline, the participant unavailable): the
/// step's attempt failed and is retried.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {reason}")]
pub struct CallFailed {
    pub step: &'static str,
    pub reason: String,
}

/// The clients of the two participants (channels connect lazily, on the first call).
#[derive(Clone)]
pub struct Participants {
    pub inventory: InventoryServiceClient<Channel>,
    pub payment: PaymentServiceClient<Channel>,
}

impl Participants {
    pub fn connect(settings: &Settings) -> Result<Self, ParticipantsError> {
        let identity = Identity::load(&settings.tls, CALLER)?;
        let inventory = channel("inventory", &settings.inventory, identity.as_ref())?;
        let payment = channel("payment", &settings.payment, identity.as_ref())?;
        Ok(Self {
            inventory: InventoryServiceClient::new(inventory),
            payment: PaymentServiceClient::new(payment),
        })
    }
}

/// A lazy channel to `participant` at `address` (`host:port`): with `identity`, TLS made
/// by its connector (tonic takes an `http://` URI with a connector of its own).
fn channel(
    participant: &'static str,
    address: &str,
    identity: Option<&Identity>,
) -> Result<Channel, ParticipantsError> {
    let invalid =
        |reason: String| ParticipantsError::Address { participant, address: address.to_owned(), reason };
    let endpoint = Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| invalid(e.to_string()))?
        .connect_timeout(CONNECT)
        .tcp_nodelay(true);
    Ok(match identity {
        Some(identity) => endpoint.connect_with_connector_lazy(identity.connector(participant)?),
        None => endpoint.connect_lazy(),
    })
}

/// One attempt of `step`'s call, bounded by [`ATTEMPT`]: a business refusal is
/// `Ok(Rejected)`, anything that is not an answer is `Err` (retried).
pub async fn attempt<T, F>(step: &'static str, call: F) -> Result<Answer<T>, CallFailed>
where
    F: Future<Output = Result<tonic::Response<T>, Status>>,
{
    match tokio::time::timeout(ATTEMPT, call).await {
        Err(_) => Err(CallFailed { step, reason: format!("no answer within {ATTEMPT:?}") }),
        Ok(Ok(response)) => Ok(Answer::Done(response.into_inner())),
        Ok(Err(status)) if is_rejection(status.code()) => {
            Ok(Answer::Rejected(format!("{step}: {}", status.message())))
        }
        Ok(Err(status)) => {
            Err(CallFailed { step, reason: format!("{:?}: {}", status.code(), status.message()) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refusal_settles_the_step_and_a_transport_failure_does_not() {
        let refused = attempt::<(), _>("charge_payment", async {
            Err(Status::failed_precondition("insufficient funds"))
        })
        .await
        .unwrap();
        assert_eq!(refused, Answer::Rejected("charge_payment: insufficient funds".into()));

        let failed =
            attempt::<(), _>("charge_payment", async { Err(Status::unavailable("connection refused")) })
                .await
                .unwrap_err();
        assert_eq!(failed.step, "charge_payment");

        let done = attempt("reserve_stock", async { Ok(tonic::Response::new(7)) }).await.unwrap();
        assert_eq!(done, Answer::Done(7));
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_without_an_answer_fails_at_its_deadline() {
        let failed = attempt::<(), _>("reserve_stock", std::future::pending()).await.unwrap_err();
        assert!(failed.reason.contains("no answer"), "{failed}");
    }

    #[test]
    fn the_peer_refuses_to_start_with_a_partial_tls_identity() {
        let mut settings = Settings::from_env(|_| None).unwrap();
        settings.tls.ca_file = "/nonexistent/ca.pem".into();
        assert!(matches!(
            Participants::connect(&settings),
            Err(ParticipantsError::Tls(TlsError::Partial(_)))
        ));
    }
}
