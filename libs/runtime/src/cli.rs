//! The command line every service binary shares (clap): no argument serves,
//! `migrate` applies the database migrations and exits (a Kubernetes init
//! container or a one-off Job, so replicas start on a migrated schema with
//! `database.migrate = false`). `--help` and `--version` as usual; an unknown
//! argument is a usage error (exit 2).

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "A sagaworks service. Configuration: the file named by APP_CONFIG_FILE, then APP_* \
             environment variables (see README, Configuration)."
)]
pub struct ServiceCli {
    #[command(subcommand)]
    pub command: Option<ServiceCommand>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
pub enum ServiceCommand {
    /// Apply the service's database migrations, then exit (0 when the schema is current).
    Migrate,
}

impl ServiceCli {
    /// The command of this process's arguments; exits with usage on a bad one.
    pub fn command() -> Option<ServiceCommand> {
        Self::parse().command
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_argument_serves_migrate_migrates_and_anything_else_is_a_usage_error() {
        assert_eq!(ServiceCli::try_parse_from(["order"]).unwrap().command, None);
        assert_eq!(
            ServiceCli::try_parse_from(["order", "migrate"]).unwrap().command,
            Some(ServiceCommand::Migrate)
        );
        let err = ServiceCli::try_parse_from(["order", "migrat"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("unrecognized subcommand 'migrat'"), "{err}");
        let help = ServiceCli::try_parse_from(["order", "--help"]).unwrap_err().to_string();
        assert!(
            help.contains("migrate") && help.contains("Apply the service's database migrations"),
            "{help}"
        );
    }
}
