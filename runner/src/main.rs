//! The `eggtimer` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;
use eggtimer::config::{Cli, Command};

/// mimalloc instead of glibc's malloc: the runner allocates per task (claim decode, the handler
/// call, the finish batch); BENCHMARKS.md has what it bought.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            if let Some(flag) = misplaced_client_flag(&e) {
                eprintln!(
                    "eggtimer: {flag} is a flag of the client commands, so it goes after the \
                     command: `eggtimer task find {flag} ...` (before a command, flags are the \
                     runner's: `eggtimer serve --help`)"
                );
                return ExitCode::from(2);
            }
            e.exit()
        }
    };
    if let Some(Command::CompilePlugin) = cli.command {
        // no logging: the runner reads stderr as the compile's error
        return match eggtimer::plugins::compile_child() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("eggtimer: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let serve = match &cli.command {
        Some(Command::Serve(a)) => a.as_ref(),
        _ => &cli.serve,
    };
    // only `serve` exports traces
    let otlp = match &cli.command {
        None | Some(Command::Serve(_)) => serve.otlp_endpoint.clone(),
        Some(_) => None,
    };
    let _tracing = match eggtimer::trace::init(&serve.log, otlp.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("eggtimer: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        None => eggtimer::serve::main(cli.serve),
        Some(Command::Serve(args)) => eggtimer::serve::main(*args),
        Some(Command::CompilePlugin) => unreachable!("handled above"),
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

/// The client flag (`--token-file`, `--url`, `--json`) an unknown-argument error names: given
/// before the command, where clap reads the runner's flags and would suggest `--token`.
fn misplaced_client_flag(e: &clap::Error) -> Option<&'static str> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let name = arg.split('=').next().unwrap_or(arg);
    ["--token-file", "--url", "--json"]
        .into_iter()
        .find(|f| *f == name)
}
