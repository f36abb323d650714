//! The `kiln` command-line interface: parses arguments, sets up logging, and hands each command
//! to the library crates. The only place that uses `anyhow`.

mod args;
mod commands;
mod data;
mod engines;
mod gpu_check;
mod infer;
mod launch;
mod logging;
mod profile_model;
mod progress;
mod report;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.verbose, cli.quiet);
    match run(cli.command) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Version => commands::version(),
        Command::Doctor { config, format } => commands::doctor(&config, format),
        Command::Profiles {
            action,
            profiles_dir,
            format,
        } => commands::profiles(action, profiles_dir.as_deref(), format),
        Command::Config {
            explain,
            config,
            format,
        } => commands::config(&config, explain, format),
        Command::Train { train, config } => match train.nproc_per_node {
            Some(n) => launch::launch(n),
            None => commands::train(&train, &config),
        },
        Command::LrFind { train, config, out } => commands::lr_find(&train, &config, out),
        Command::Infer {
            model,
            inputs,
            output,
            no_compare,
            format,
            sliding_window,
            class_map,
            probabilities,
        } => match sliding_window {
            true => {
                let values = match (class_map, probabilities) {
                    (true, _) => kiln_infer::volume::VolumeValues::ClassMap,
                    (_, true) => kiln_infer::volume::VolumeValues::Probabilities,
                    _ => kiln_infer::volume::VolumeValues::Scores,
                };
                infer::sliding(&model, &inputs, output.as_deref(), values, format)
            }
            false => infer::infer(&model, &inputs, output.as_deref(), no_compare, format),
        },
        Command::Export {
            model,
            out,
            format,
            mode,
            input_shape,
            quantize,
            check_data,
            config,
            sets,
        } => infer::export(&infer::ExportArgs {
            model,
            out,
            format,
            mode,
            input_shape,
            quantize,
            check_data,
            config,
            sets,
        }),
        Command::Serve {
            model,
            input_shape,
            host,
            port,
            max_wait_ms,
        } => {
            let flags = args::given([
                ("--host", "serve.host", &host),
                ("--port", "serve.port", &port),
                ("--max-wait-ms", "serve.max_wait_ms", &max_wait_ms),
            ]);
            infer::serve(&model, input_shape.as_deref(), flags)
        }
        Command::ProfileModel(args) => profile_model::run(&args),
        Command::Data { action } => data::run(action),
        Command::GpuCheck(args) => gpu_check::run(&args),
    }
}
