//! `gateway`: see the library docs.

/// mimalloc: less CPU per request than glibc malloc for the many small,
/// short-lived allocations of a request.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Refuses to start unless APP_ENVIRONMENT (or the file) says where it runs.
    let settings: gateway::config::Settings = sagaworks_config::load_service()?;
    let telemetry = sagaworks_telemetry::init("gateway", env!("CARGO_PKG_VERSION"), &settings.telemetry)?;
    // Secrets show as [REDACTED] (see `config::AuthSettings`).
    tracing::info!(settings = ?settings, "gateway settings");
    let shutdown = sagaworks_runtime::shutdown::on_signal();
    // Logs and counts stalls of the runtime (a task blocking a worker thread).
    sagaworks_runtime::watchdog::spawn()?;
    let app = gateway::startup::Application::build(settings).await?;
    tracing::info!(port = app.port(), "gateway listening");
    let result = app.run_until_stopped(shutdown).await;
    telemetry.shutdown().await?;
    Ok(result?)
}
