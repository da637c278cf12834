use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = gpupass::cli::parse();
    // No subscriber unless logs are asked for (or a plugin runs): the registry costs the short
    // commands more than their own work (docs/performance.md, "Start-up").
    if cli.wants_logging() {
        gpupass::cli::init_logging(cli.globals.verbose, cli.globals.log_format, cli.globals.color);
    }
    tracing::debug!(faults = gpupass::minor_faults(), "arguments parsed");
    // Block-buffered: a pretty JSON inventory is tens of thousands of lines, and the line-
    // buffered stdout would make one write(2) per line.
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, stdout.lock());
    match gpupass::cli::run(cli, &mut out) {
        Ok(exit) => match out.flush() {
            // The reader went away (`gpupass list | head`): stop quietly, as other Unix tools do.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            _ => ExitCode::from(exit.code()),
        },
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            let _ = out.flush();
            gpupass::messages::error(e.prefix(), &e);
            ExitCode::from(e.status())
        }
    }
}
