use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = gpupass::cli::parse();
    gpupass::cli::init_logging(cli.globals.verbose, cli.globals.log_format, cli.globals.color);
    tracing::debug!(faults = gpupass::minor_faults(), "arguments parsed");
    // Block-buffered: a pretty JSON inventory is tens of thousands of lines, and the line-
    // buffered stdout would make one write(2) per line.
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, stdout.lock());
    match gpupass::cli::run(cli, &mut out) {
        Ok(code) => match out.flush() {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            _ => ExitCode::from(code.clamp(0, 255) as u8),
        },
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = out.flush();
            eprintln!("gpupass: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The reader went away (`gpupass list | head`): stop quietly, as other Unix tools do.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
