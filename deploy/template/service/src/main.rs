//! `{{name}}`: see the library docs.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let command = sagaworks_runtime::ServiceCli::command();
    let settings: {{name}}::config::Settings = sagaworks_config::load_service()?;
    let telemetry = sagaworks_telemetry::init("{{name}}", env!("CARGO_PKG_VERSION"), &settings.telemetry)?;
    if command == Some(sagaworks_runtime::ServiceCommand::Migrate) {
        let result = {{name}}::startup::migrate(&settings).await;
        if result.is_ok() {
            tracing::info!("{{name}} migrations applied");
        }
        telemetry.shutdown().await?;
        return Ok(result?);
    }
    let shutdown = sagaworks_runtime::shutdown::on_signal();
    // Logs and counts stalls of the runtime (a task blocking a worker thread).
    sagaworks_runtime::watchdog::spawn()?;
    let app = {{name}}::startup::Application::build(settings).await?;
    tracing::info!(grpc = app.grpc_port(), http = app.http_port(), "{{name}} listening");
    let result = app.run_until_stopped(shutdown).await;
    telemetry.shutdown().await?;
    Ok(result?)
}
