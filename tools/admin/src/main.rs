//! `sagaworks-admin`: see the library docs (`cargo doc -p sagaworks-admin`) or `--help`.

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    sagaworks_admin::main_with(sagaworks_admin::cli::Cli::parse_args()).await
}
