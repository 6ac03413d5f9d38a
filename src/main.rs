//! The `edra` binary: parse the command line, load and validate configuration, set up
//! logging, then hand over to the library. Exit codes: 0 success, 1 runtime failure,
//! 64 invalid configuration or usage (EX_USAGE).

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use edra::cli::{
    Cli, Command, DoctorOutputArg, OutputArg, SelftestArgs, SelftestOutputArg, StatusArgs, StatusOutputArg,
};
use edra::config::Config;

/// EX_USAGE from sysexits.h: the configuration or command line is wrong.
const EXIT_CONFIG: u8 = 64;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_failure(&e),
    };
    if let Some(e) = cli.unused_global_flags() {
        return usage_failure(&e);
    }
    if let Command::Version = cli.command {
        println!("edra {}", edra::VERSION);
        println!("target: {}-{}", std::env::consts::ARCH, std::env::consts::OS);
        println!("kubelet APIs: v1.DRAPlugin, v1beta1.DRAPlugin; resource.k8s.io: v1, v1beta2, v1beta1");
        return ExitCode::SUCCESS;
    }
    // Hooks are run by the container runtime, with no edra configuration around them.
    if let Command::Hook(hook) = &cli.command {
        return match edra::hook::run(&hook.command, std::io::stdin().lock()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("edra hook {}: {}", hook.command.name(), edra::util::error_chain(&e));
                ExitCode::from(e.exit_code())
            }
        };
    }
    if let Command::InstallHook(args) = &cli.command {
        return install_hook(&args.dest);
    }
    let ctx = match cli.load_context() {
        Ok(ctx) => ctx,
        Err(errors) => return config_failure(errors),
    };
    let config = match Config::load(&ctx) {
        Ok(c) => c,
        Err(problems) => return config_failure(problems.iter().map(ToString::to_string).collect()),
    };
    // The self-test's report is its output; the agent's own log lines only when asked for.
    let quiet = matches!(cli.command, Command::Selftest(_) | Command::Status(_)) && cli.global.log_level.is_none();
    edra::telemetry::init(config.log_format, if quiet { "warn" } else { &config.log_level });
    let result = match cli.command {
        Command::Run(_) => edra::app::run_blocking(config),
        Command::Inventory(args) => return inventory(&config, args.output),
        Command::Doctor(args) => return doctor(&config, args.output),
        Command::Selftest(args) => return selftest(&config, args),
        Command::Status(args) => return status(&config, &args),
        Command::Version | Command::Hook(_) | Command::InstallHook(_) => unreachable!("handled above"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(edra::app::AppError::Config(msg)) => config_failure(vec![msg]),
        Err(edra::app::AppError::Problems(problems)) => config_failure(problems),
        Err(e) => {
            print_error(&[format!("edra: {}", edra::util::error_chain(&e))]);
            ExitCode::FAILURE
        }
    }
}

/// `edra install-hook DEST`: no configuration, one line saying what was done.
fn install_hook(dest: &std::path::Path) -> ExitCode {
    use edra::hook::install::{Installed, install};
    match install(dest) {
        Ok(Installed::Copied { bytes }) => {
            println!("edra install-hook: copied edra ({bytes} bytes) to {}", dest.display())
        }
        Ok(Installed::Unchanged { bytes }) => {
            println!("edra install-hook: {} is already this edra ({bytes} bytes)", dest.display())
        }
        Err(e) => {
            eprintln!("edra install-hook: {}", edra::util::error_chain(&e));
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Writes why edra stops to stderr; under systemd's journal each line carries priority 3
/// (err), as the log's own error lines do, so `journalctl -p err -u edra` shows it.
fn print_error(lines: &[String]) {
    use std::io::Write;
    let prefix = if edra::telemetry::LogStyle::detect().journald { "<3>" } else { "" };
    let mut stderr = std::io::stderr().lock();
    for line in lines {
        let _ = writeln!(stderr, "{prefix}{line}");
    }
}

/// `edra inventory`: table on a terminal, JSON otherwise.
fn inventory(config: &Config, output: Option<OutputArg>) -> ExitCode {
    use edra::publish::report::{Format, run};
    let stdout = std::io::stdout();
    let format = match output {
        Some(OutputArg::Json) => Format::Json,
        Some(OutputArg::Yaml) => Format::Yaml,
        Some(OutputArg::Table) => Format::Table,
        None if stdout.is_terminal() => Format::Table,
        None => Format::Json,
    };
    match run(config, format, &mut stdout.lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            print_error(&[format!("edra: {}", edra::util::error_chain(&e))]);
            ExitCode::FAILURE
        }
    }
}

/// `edra doctor`: table on a terminal, JSON otherwise; exit 1 when a check failed.
fn doctor(config: &Config, output: Option<DoctorOutputArg>) -> ExitCode {
    let stdout = std::io::stdout();
    let json = match output {
        Some(DoctorOutputArg::Json) => true,
        Some(DoctorOutputArg::Table) => false,
        None => !stdout.is_terminal(),
    };
    let result = edra::doctor::run_blocking(config)
        .and_then(|report| edra::doctor::write(&report, json, &mut stdout.lock()).map(|()| report.exit_code()));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("edra doctor: {}", edra::util::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// `edra selftest`: the report as text or JSON; exit 1 when a check failed.
fn selftest(config: &Config, args: SelftestArgs) -> ExitCode {
    let options = edra::selftest::Options {
        image: args.image,
        command: args.command,
        change_gpu_settings: args.change_gpu_settings,
        work_dir: args.work_dir,
        runtime: args.runtime,
    };
    match edra::selftest::run_blocking(config, &options) {
        Ok(report) => {
            let text = match args.output {
                SelftestOutputArg::Json => edra::selftest::render::json(&report),
                SelftestOutputArg::Text => edra::selftest::render::text(&report),
            };
            use std::io::Write as _;
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            ExitCode::from(report.exit_code())
        }
        Err(e) => {
            eprintln!("edra selftest: {}", edra::util::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// `edra status`: the running agent's view, once or every two seconds.
fn status(config: &Config, args: &StatusArgs) -> ExitCode {
    use std::io::Write as _;
    let socket = edra::status::server::socket_path(&config.paths.runtime_dir);
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("edra status: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let clear = args.watch && std::io::stdout().is_terminal();
    loop {
        let text = match rt.block_on(edra::status::client::fetch(&socket)) {
            Ok(view) => match args.output {
                StatusOutputArg::Json => edra::status::render::json(&view),
                StatusOutputArg::Text => edra::status::render::text(&view, false),
                StatusOutputArg::Wide => edra::status::render::text(&view, true),
            },
            Err(e) if !args.watch => {
                eprintln!("edra status: {}", edra::util::escape_controls(&edra::util::error_chain(&e)));
                return ExitCode::FAILURE;
            }
            Err(e) => format!("edra status: {}\n", edra::util::escape_controls(&edra::util::error_chain(&e))),
        };
        let mut out = std::io::stdout().lock();
        let written = if clear { out.write_all(b"\x1b[H\x1b[2J") } else { Ok(()) }
            .and_then(|()| out.write_all(text.as_bytes()))
            .and_then(|()| out.flush());
        if written.is_err() || !args.watch {
            return ExitCode::SUCCESS;
        }
        drop(out);
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
}

/// Prints clap's message; `--help` and `--version` exit 0, every usage error 64 (clap
/// itself would exit 2, which systemd's `RestartPreventExitStatus=64` does not catch).
fn usage_failure(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let _ = e.print();
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
        _ => ExitCode::from(EXIT_CONFIG),
    }
}

fn config_failure(problems: Vec<String>) -> ExitCode {
    let mut out = vec![format!(
        "edra: invalid configuration ({} problem{}):",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" }
    )];
    // A problem of several lines keeps them under its bullet.
    for p in problems {
        let mut lines = p.lines();
        out.push(format!("  - {}", lines.next().unwrap_or_default()));
        out.extend(lines.map(|line| format!("    {line}")));
    }
    print_error(&out);
    ExitCode::from(EXIT_CONFIG)
}
