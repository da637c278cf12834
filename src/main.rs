use clap::Parser;
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = gpupass::cli::Cli::parse();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match gpupass::cli::run(cli, &mut out) {
        Ok(code) => {
            let _ = out.flush();
            ExitCode::from(code.clamp(0, 255) as u8)
        }
        Err(e) => {
            let _ = out.flush();
            eprintln!("gpupass: {e:#}");
            ExitCode::from(1)
        }
    }
}
