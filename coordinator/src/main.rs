//! `skilleval-coordinator`: parses the command line, loads configuration, sets up telemetry and
//! hands over to the library (`serve`, the default, `migrate`, or the operator's `admin`
//! tools).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use skilleval_coordinator::parked;
use skilleval_coordinator::startup::{migrate, Application};
use skilleval_infra::config::Settings;
use skilleval_infra::store::parked::ParkedState;
use tokio::signal;

#[derive(Debug, Parser)]
#[command(
    name = "skilleval-coordinator",
    version,
    about = "skilleval's coordinator: HTTP API, run publishing and aggregation"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply migrations, then serve the API and run the aggregator (the default).
    Serve,
    /// Apply the database migrations and exit (what the Kubernetes migrate Job runs).
    Migrate {
        /// Create the database first when it does not exist (needs CREATEDB on the server).
        #[arg(long)]
        create_database: bool,
    },
    /// Operator tools (the same as the `/v1/admin` endpoints, without the HTTP API).
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Publisher API tokens (the same as `/v1/admin/tokens`): stored as a hash only.
    Tokens {
        #[command(subcommand)]
        command: TokensCommand,
    },
}

#[derive(Debug, Subcommand)]
enum TokensCommand {
    /// Create a token; its secret is printed once, here, and never again.
    Create {
        /// The publisher it acts for (created on first use).
        #[arg(long)]
        publisher: String,
        /// Comma-separated: skills:write, runs:write, read, samples:write, admin.
        #[arg(long, value_delimiter = ',', required = true)]
        scopes: Vec<String>,
    },
    /// List tokens as JSON: prefix, publisher, scopes, last use, revocation.
    List,
    /// Revoke a token by prefix or id; refused from the next request on, on every replica.
    Revoke {
        /// The token's prefix (`skev_...`, from `list`) or id.
        token: String,
    },
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Jobs drained from the parking queue.
    Parked {
        #[command(subcommand)]
        command: ParkedCommand,
    },
}

#[derive(Debug, Subcommand)]
enum ParkedCommand {
    /// List parked jobs, newest first, as JSON.
    List {
        /// Only those in this state: errored, unmatched or requeued.
        #[arg(long, value_parser = parse_parked_state)]
        state: Option<ParkedState>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Publish a parked job again; an errored one gives its case back to its run first.
    Requeue {
        /// The parked job's id (from `list`).
        id: uuid::Uuid,
    },
}

fn parse_parked_state(s: &str) -> Result<ParkedState, String> {
    match s {
        "errored" => Ok(ParkedState::Errored),
        "unmatched" => Ok(ParkedState::Unmatched),
        "requeued" => Ok(ParkedState::Requeued),
        other => Err(format!(
            "`{other}` is not a state: use errored, unmatched or requeued"
        )),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut telemetry = match skilleval_infra::telemetry::init(
        &settings.log,
        &settings.telemetry,
        "skilleval-coordinator",
    ) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = match cli.command.unwrap_or(Command::Serve) {
        Command::Migrate { create_database } => migrate(&settings, create_database)
            .await
            .map(|()| tracing::info!("migrations applied")),
        Command::Serve => serve(settings).await,
        Command::Admin {
            command: AdminCommand::Parked { command },
        } => admin_parked(&settings, command).await,
        Command::Tokens { command } => tokens(&settings, command).await,
    };
    // After a SIGTERM too: the spans of the last requests are exported before the exit.
    telemetry.shutdown();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = ?e, "coordinator failed");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn admin_parked(settings: &Settings, command: ParkedCommand) -> anyhow::Result<()> {
    let answer = match command {
        ParkedCommand::List { state, limit } => parked::admin_list(settings, state, limit).await?,
        ParkedCommand::Requeue { id } => parked::admin_requeue(settings, id).await?,
    };
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(())
}

async fn tokens(settings: &Settings, command: TokensCommand) -> anyhow::Result<()> {
    use skilleval_coordinator::routes::tenancy::{check_publisher, parse_scopes};
    use skilleval_infra::store::tenancy::NewToken;
    let store = skilleval_infra::store::Store::connect(&settings.database).await?;
    let answer = match command {
        TokensCommand::Create { publisher, scopes } => {
            check_publisher("--publisher", &publisher)
                .map_err(|e| anyhow::anyhow!("{}", e.message))?;
            let scopes =
                parse_scopes("--scopes", &scopes).map_err(|e| anyhow::anyhow!("{}", e.message))?;
            let secret = skilleval_coordinator::auth::generate_token();
            let row = store
                .create_token(&NewToken {
                    publisher: &publisher,
                    prefix: &secret.prefix,
                    hash: &secret.hash,
                    scopes: &scopes,
                })
                .await?;
            let mut doc = serde_json::json!(row);
            doc["token"] = serde_json::json!(secret.secret);
            doc
        }
        TokensCommand::List => serde_json::json!({ "tokens": store.list_tokens(None).await? }),
        TokensCommand::Revoke { token } => match store.revoke_token(&token).await? {
            Some(row) => serde_json::json!(row),
            None => anyhow::bail!("no token with the prefix or id `{token}`"),
        },
    };
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(())
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    let app = Application::build(settings).await?;
    let token = app.shutdown_token();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutdown signal received");
        token.cancel();
    });
    app.run_until_stopped().await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match signal::unix::signal(signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
