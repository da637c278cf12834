//! The unix sockets both kubelet plugins serve and dial: a listener at a path (a stale socket
//! of an earlier run replaced, mode 0600: only root, i.e. the kubelet, may talk to it), the
//! directories they live in, a gRPC channel to a socket, and a file's identity (the kubelet
//! wipes and recreates sockets when it restarts).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

/// A unix socket listener at `path`, mode 0600; a socket left there by an earlier run (or the
/// kubelet) is removed first. Needs a tokio runtime.
pub(crate) fn listen(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let l = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// `path` and its parents created; `mode` set on `path` when given.
#[cfg(any(feature = "dra", test))]
pub(crate) fn make_dir(path: &Path, mode: Option<u32>) -> std::io::Result<()> {
    std::fs::create_dir_all(path)?;
    if let Some(m) = mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(m))?;
    }
    Ok(())
}

/// A gRPC channel over the unix socket at `path` (the authority sent is `localhost`): connect
/// within 5 s, each call within 30 s.
pub async fn connect_unix(path: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
}

/// Identity of a file: a recreated socket has a new inode or change time.
pub(crate) type FileId = (u64, u64, i64, i64);

/// The identity of the file at `p` (not following a link), `None` when there is none.
pub(crate) fn file_id(p: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_socket_is_replaced_and_the_new_one_is_root_only() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("plugins/x");
        make_dir(&dir, Some(0o700)).unwrap();
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let p = dir.join("x.sock");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let first = listen(&p).unwrap();
            let id = file_id(&p).unwrap();
            drop(first);
            // The socket file outlives its listener: the next run binds over it.
            assert!(p.exists());
            let _second = listen(&p).unwrap();
            assert_ne!(file_id(&p), Some(id), "a new socket");
            assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
            // A directory where the socket should be is an error, not removed.
            let d = dir.join("busy.sock");
            std::fs::create_dir(&d).unwrap();
            assert!(listen(&d).is_err());
            assert!(d.is_dir());
        });
    }
}
