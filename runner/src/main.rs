//! The `eggtimer` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;
use eggtimer::config::{Cli, Command};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log = match &cli.command {
        Some(Command::Serve(a)) => a.log.clone(),
        _ => cli.serve.log.clone(),
    };
    let filter = EnvFilter::try_new(&log).unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        None => eggtimer::serve::main(cli.serve),
        Some(Command::Serve(args)) => eggtimer::serve::main(*args),
        Some(cmd) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(eggtimer::cli::run(cmd))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("eggtimer: {e:#}");
            ExitCode::FAILURE
        }
    }
}
