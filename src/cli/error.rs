//! The commands' one error type, which knows its exit status, and the exit status of a
//! command that ran to the end.
//!
//! Every command returns `Result<Exit, Error>` ([`super::run`]). The modules below the commands
//! keep their own `thiserror` enums (each carries the path or address and the fix); converting
//! one into [`Error`] decides its exit status once, here: 2 for a usage error (the module's
//! `is_usage()`), 1 for everything else. `main.rs` prints an `Error` once, with its whole chain
//! (`outer: cause: cause`), and exits with [`Error::status`].

use std::fmt;

/// How a command that did not fail ends: 0, or 1 when it ran and found what it checks for
/// missing (`check` not ready, a `boot --check` verdict that failed, a dry run that would be
/// refused), or the guest's own status (`boot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit(pub u8);

impl Exit {
    pub(crate) const SUCCESS: Exit = Exit(0);
    /// Ran, and the answer is no.
    pub(crate) const FAILURE: Exit = Exit(1);

    pub(crate) fn failure_if(failed: bool) -> Exit {
        if failed {
            Exit::FAILURE
        } else {
            Exit::SUCCESS
        }
    }

    pub fn code(self) -> u8 {
        self.0
    }
}

/// A command's error: what went wrong (with its causes) and the exit status it means.
pub struct Error {
    status: u8,
    /// Who speaks: `gpupass`, or `gpupass oci-hook` (a runtime's log shows the hook's lines
    /// among others).
    prefix: &'static str,
    inner: anyhow::Error,
}

impl Error {
    /// A host error (exit status 1): the device, group, driver, kernel or file system said no.
    pub(crate) fn host(e: impl Into<anyhow::Error>) -> Error {
        Error {
            status: 1,
            prefix: "gpupass",
            inner: e.into(),
        }
    }

    /// A usage error (exit status 2): the command line asks for something that cannot be.
    pub(crate) fn usage(e: impl Into<anyhow::Error>) -> Error {
        Error {
            status: 2,
            prefix: "gpupass",
            inner: e.into(),
        }
    }

    /// An error with the exit status its module chose (the OCI hook's 1 or 2).
    pub(crate) fn with_status(status: u8, e: impl Into<anyhow::Error>) -> Error {
        Error {
            status,
            prefix: "gpupass",
            inner: e.into(),
        }
    }

    pub(crate) fn prefixed(mut self, prefix: &'static str) -> Error {
        self.prefix = prefix;
        self
    }

    pub fn status(&self) -> u8 {
        self.status
    }

    pub fn prefix(&self) -> &'static str {
        self.prefix
    }

    /// The reader went away (`gpupass list | head`): stop quietly, as other Unix tools do.
    pub fn is_broken_pipe(&self) -> bool {
        self.inner.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        })
    }

    /// Add what was being done, as anyhow's `context` does (`cannot write X: <the error>`).
    pub(crate) fn context(self, what: impl fmt::Display + Send + Sync + 'static) -> Error {
        Error {
            inner: self.inner.context(what),
            ..self
        }
    }
}

/// The whole chain, `outer: cause: cause` (anyhow's alternate form).
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.inner)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error(status {}): {:?}", self.status, self.inner)
    }
}

/// Errors that are host errors whatever their variant.
macro_rules! host_errors {
    ($($t:ty),* $(,)?) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                Error::host(e)
            }
        }
    )*};
}

/// Errors whose module says which variants are usage errors (`is_usage`).
macro_rules! classified_errors {
    ($($t:ty),* $(,)?) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                if e.is_usage() {
                    Error::usage(e)
                } else {
                    Error::host(e)
                }
            }
        }
    )*};
}

host_errors!(
    anyhow::Error,
    std::io::Error,
    serde_json::Error,
    crate::inventory::InventoryError,
    crate::bind::BindError,
    crate::change::ChangeError,
    crate::inventory::snapshot::SnapshotError,
    crate::inventory::native::ContainerError,
);

classified_errors!(
    crate::mdev::MdevError,
    crate::cli::vmout::VmOutError,
    crate::output::cdi::CdiError,
    crate::containers::cdi::SpecError,
);

#[cfg(feature = "vmm")]
classified_errors!(crate::vmm::VmmError);

#[cfg(feature = "deviceplugin")]
host_errors!(crate::containers::deviceplugin::server::PluginError);

/// A result of the commands' shape.
pub type Result<T = Exit, E = Error> = std::result::Result<T, E>;
