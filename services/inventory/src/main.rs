//! `inventory`: see the library docs.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings: inventory::config::Settings = sagaworks_config::load()?;
    let shutdown = sagaworks_runtime::shutdown::on_signal();
    let app = inventory::startup::Application::build(settings).await?;
    tracing::info!(grpc = app.grpc_port(), http = app.http_port(), "inventory listening");
    app.run_until_stopped(shutdown).await?;
    Ok(())
}
