//! `order`: see the library docs.

/// mimalloc: less CPU per request than glibc malloc for the many small,
/// short-lived allocations of a request.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let command = sagaworks_runtime::ServiceCli::command();
    // Refuses to start unless APP_ENVIRONMENT (or the file) says where it runs.
    let settings: order::config::Settings = sagaworks_config::load_service()?;
    let telemetry = sagaworks_telemetry::init("order", env!("CARGO_PKG_VERSION"), &settings.telemetry)?;
    if command == Some(sagaworks_runtime::ServiceCommand::Migrate) {
        let result = order::startup::migrate(&settings).await;
        if result.is_ok() {
            tracing::info!("order migrations applied");
        }
        telemetry.shutdown().await?;
        return Ok(result?);
    }
    let shutdown = sagaworks_runtime::shutdown::on_signal();
    // Logs and counts stalls of the runtime (a task blocking a worker thread).
    sagaworks_runtime::watchdog::spawn()?;
    let app = order::startup::Application::build(settings).await?;
    tracing::info!(grpc = app.grpc_port(), http = app.http_port(), "order listening");
    let result = app.run_until_stopped(shutdown).await;
    telemetry.shutdown().await?;
    Ok(result?)
}
