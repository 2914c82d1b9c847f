//! The order saga of sagaworks orchestrated by Restate (its Rust SDK) instead of the saga
//! library: the peer `scripts/bench-peer --peer restate` measures side by side with
//! sagaworks. A Restate service endpoint (HTTP/2) on PEER_PORT serving the virtual object
//! `OrderSaga` (handler `place`); restate-server calls it once it is registered. It
//! stands in for the order service: its certificate towards the participants, its Kafka
//! user towards the broker (see `settings`).

mod events;
mod order;
mod participants;
mod saga;
mod settings;

use restate_sdk::prelude::{Endpoint, HttpServer};
use std::process::ExitCode;

#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error(transparent)]
    Settings(#[from] settings::SettingsError),
    #[error(transparent)]
    Participants(#[from] participants::ParticipantsError),
    #[error(transparent)]
    Events(#[from] events::PublishError),
    #[error("cannot listen on {0}: {1}")]
    Listen(std::net::SocketAddr, std::io::Error),
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("restate-peer: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), StartError> {
    let settings = settings::Settings::from_env(|name| std::env::var(name).ok())?;
    let participants = participants::Participants::connect(&settings)?;
    let publisher = events::Publisher::new(&settings.kafka)?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| StartError::Listen(settings.listen, e))?;
    println!(
        "restate-peer: OrderSaga on {}, inventory {}, payment {} ({}), events {}",
        settings.listen,
        settings.inventory,
        settings.payment,
        if settings.tls.enabled() { "mutual TLS as order" } else { "plaintext" },
        publisher.describe(&settings.kafka),
    );
    let endpoint = Endpoint::builder().bind(saga::OrderSaga::new(participants, publisher)).build();
    HttpServer::new(endpoint).serve_with_cancel(listener, shutdown()).await;
    Ok(())
}

/// SIGINT or SIGTERM.
async fn shutdown() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler can be installed");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
