//! OCI runtime hook (in progress).
pub fn run_cli(_host: &crate::host::HostRoot) -> anyhow::Result<i32> {
    Ok(0)
}
