//! The one sink for what gpupass tells a person on stderr besides its logs: warnings, notes,
//! progress lines and the final error.
//!
//! Library code never calls `eprintln!`: a scan that found a garbled attribute, a bind that
//! waits for another gpupass's lock, a renderer's advice all say it here, so the wording is
//! uniform (`warning: ...`, `note: ...`), and unit tests can capture what a function said
//! ([`capture`], test builds only). Logs (`tracing`, `-v`) are separate: they are for
//! debugging, these are for the user and are printed at every verbosity.

use std::fmt::Display;

#[cfg(test)]
thread_local! {
    static CAPTURED: std::cell::RefCell<Option<Vec<String>>> = const { std::cell::RefCell::new(None) };
}

fn emit(text: &str) {
    #[cfg(test)]
    {
        let captured = CAPTURED.with(|c| {
            if let Some(v) = c.borrow_mut().as_mut() {
                v.push(text.to_string());
                true
            } else {
                false
            }
        });
        if captured {
            return;
        }
    }
    use std::io::Write;
    // One write per message, so lines of two processes do not interleave mid-line.
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// `warning: MSG`: something is odd but the command goes on.
pub fn warn(msg: impl Display) {
    emit(&format!("warning: {msg}\n"));
}

/// `note: MSG`: advice about the output (what to add to a VM definition, a limit that applies).
pub fn note(msg: impl Display) {
    emit(&format!("note: {msg}\n"));
}

/// One line as it is (progress: "waiting for another gpupass ...", a tool's own prefix).
pub fn line(msg: impl Display) {
    emit(&format!("{msg}\n"));
}

/// Text as it is, already ending in newlines (a multi-line summary).
pub fn text(s: &str) {
    emit(s);
}

/// `PREFIX: ERROR`: an error that ends the command, or (startup) one item that failed while
/// the others go on. `err` is shown with its whole chain (`outer: cause: cause`).
pub fn error(prefix: &str, err: impl Display) {
    emit(&format!("{prefix}: {err}\n"));
}

/// Run `f`, keeping what it says instead of printing it (unit tests).
#[cfg(test)]
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, Vec<String>) {
    CAPTURED.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let r = f();
    let said = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (r, said)
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_kind_has_its_prefix() {
        let ((), said) = super::capture(|| {
            super::warn("w");
            super::note(format_args!("n {}", 1));
            super::line("gpupass: waiting");
            super::error("gpupass oci-hook", "bad state");
            super::text("a\nb\n");
        });
        assert_eq!(
            said,
            [
                "warning: w\n",
                "note: n 1\n",
                "gpupass: waiting\n",
                "gpupass oci-hook: bad state\n",
                "a\nb\n"
            ]
        );
    }
}
