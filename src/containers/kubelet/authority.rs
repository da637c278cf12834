//! The registration socket's HTTP/2 `:authority` repair.
//!
//! The kubelet's plugin watcher dials a registration socket with grpc-go's default
//! (passthrough) target and no authority override (k8s.io/kubernetes v1.37.2,
//! `pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go`, `dial`), so its
//! requests carry the socket's path as `:authority`
//! (`/var/lib/kubelet/plugins_registry/vfio.gpupass.dev-reg.sock`). A path is not an authority;
//! h2, the HTTP/2 of tonic, resets such a stream with PROTOCOL_ERROR ("malformed authority"), so
//! the kubelet's `GetInfo` fails and a Rust plugin is never registered (the kubelet's DRA
//! plugin client and its device-plugin client set `localhost`; the plugin watcher does not:
//! kubernetes/kubernetes#108254, #109081).
//!
//! [`relay`] sits between an accepted registration connection and the gRPC server: every
//! frame passes unchanged in both directions, except the client's header blocks (HEADERS and
//! their CONTINUATIONs), which are decoded (HPACK, with the client's dynamic table), given
//! `:authority: localhost` when theirs is not a valid authority, and encoded again as literals
//! without indexing (so the server's table is never used and cannot drift).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// HTTP/2's default SETTINGS_MAX_FRAME_SIZE (what h2 serves with): frames written are no larger.
const MAX_FRAME: usize = 16_384;
/// The largest header block accepted from the client (the kubelet's are a few hundred bytes).
const MAX_BLOCK: usize = 1 << 20;

fn bad(m: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, m.into())
}

/// An `:authority` h2 accepts: host (name, IPv4 or bracketed IPv6), optional port, optional
/// userinfo; never a path.
fn valid_authority(v: &[u8]) -> bool {
    !v.is_empty()
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~:[]@!$&'()*+,;=".contains(b))
}

/// The header list with an invalid `:authority` replaced by `localhost`; whether it changed.
pub(crate) fn repair(headers: &mut [(Vec<u8>, Vec<u8>)]) -> bool {
    let mut changed = false;
    for (n, v) in headers.iter_mut() {
        if n == b":authority" && !valid_authority(v) {
            *v = b"localhost".to_vec();
            changed = true;
        }
    }
    changed
}

/// HPACK integer with an `n`-bit prefix, the first byte's high bits `first`.
fn int(out: &mut Vec<u8>, first: u8, n: u8, v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    let mut r = v - max;
    while r >= 128 {
        out.push((r % 128) as u8 | 0x80);
        r /= 128;
    }
    out.push(r as u8);
}

/// A header block of literals without indexing, new names, no Huffman (RFC 7541 6.2.2).
pub(crate) fn encode(headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (n, v) in headers {
        out.push(0x00);
        int(&mut out, 0, 7, n.len());
        out.extend_from_slice(n);
        int(&mut out, 0, 7, v.len());
        out.extend_from_slice(v);
    }
    out
}

fn frame_header(len: usize, kind: u8, flags: u8, stream: u32) -> [u8; 9] {
    let l = (len as u32).to_be_bytes();
    let s = stream.to_be_bytes();
    [l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<([u8; 9], Vec<u8>)>> {
    let mut h = [0u8; 9];
    match r.read_exact(&mut h).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
    if len > MAX_BLOCK {
        return Err(bad(format!("an HTTP/2 frame of {len} bytes")));
    }
    let mut p = vec![0u8; len];
    r.read_exact(&mut p).await?;
    Ok(Some((h, p)))
}

/// The client-to-server half: frames copied, header blocks repaired.
pub(crate) async fn client_to_server<R, W>(mut from: R, mut to: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(bad("not an HTTP/2 connection preface"));
    }
    to.write_all(&preface).await?;
    let mut decoder = hpack::Decoder::new();
    while let Some((h, p)) = read_frame(&mut from).await? {
        let (kind, flags) = (h[3], h[4]);
        let stream = u32::from_be_bytes([h[5] & 0x7f, h[6], h[7], h[8]]);
        if kind != HEADERS {
            to.write_all(&h).await?;
            to.write_all(&p).await?;
            to.flush().await?;
            continue;
        }
        // HEADERS: [pad length] [priority: 5 bytes] fragment [padding].
        let mut at = 0;
        let mut end = p.len();
        if flags & PADDED != 0 {
            let pad = *p
                .first()
                .ok_or_else(|| bad("a padded HEADERS frame without its pad length"))?
                as usize;
            at = 1;
            end = end
                .checked_sub(pad)
                .ok_or_else(|| bad("HEADERS padding longer than the frame"))?;
        }
        let priority = if flags & PRIORITY != 0 {
            let pr = p
                .get(at..at + 5)
                .ok_or_else(|| bad("a HEADERS frame too short for its priority"))?
                .to_vec();
            at += 5;
            Some(pr)
        } else {
            None
        };
        let mut block = p
            .get(at..end)
            .ok_or_else(|| bad("a HEADERS frame shorter than its padding"))?
            .to_vec();
        let mut last = flags;
        while last & END_HEADERS == 0 {
            let Some((ch, cp)) = read_frame(&mut from).await? else {
                return Err(bad("the connection ended inside a header block"));
            };
            if ch[3] != CONTINUATION {
                return Err(bad("a header block interrupted by another frame"));
            }
            if block.len() + cp.len() > MAX_BLOCK {
                return Err(bad("a header block larger than 1 MiB"));
            }
            block.extend_from_slice(&cp);
            last = ch[4];
        }
        let mut headers = decoder
            .decode(&block)
            .map_err(|e| bad(format!("an HPACK header block gpupass cannot decode: {e:?}")))?;
        repair(&mut headers);
        let mut payload = priority.clone().unwrap_or_default();
        payload.extend_from_slice(&encode(&headers));
        // One HEADERS frame, then CONTINUATIONs if the block is larger than a frame.
        let mut chunks = payload.chunks(MAX_FRAME).peekable();
        let mut first = true;
        if payload.is_empty() {
            to.write_all(&frame_header(
                0,
                HEADERS,
                (flags & END_STREAM) | END_HEADERS,
                stream,
            ))
            .await?;
        }
        while let Some(c) = chunks.next() {
            let done = chunks.peek().is_none();
            let (kind, mut fl) = if first {
                (
                    HEADERS,
                    (flags & END_STREAM) | if priority.is_some() { PRIORITY } else { 0 },
                )
            } else {
                (CONTINUATION, 0)
            };
            if done {
                fl |= END_HEADERS;
            }
            to.write_all(&frame_header(c.len(), kind, fl, stream)).await?;
            to.write_all(c).await?;
            first = false;
        }
        to.flush().await?;
    }
    to.shutdown().await
}

/// Relays one registration connection to the gRPC server's end of an in-memory pipe.
pub(crate) async fn relay<C, S>(client: C, server: S)
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (cr, mut cw) = tokio::io::split(client);
    let (mut sr, sw) = tokio::io::split(server);
    let up = client_to_server(cr, sw);
    let down = async {
        let r = tokio::io::copy(&mut sr, &mut cw).await;
        let _ = cw.shutdown().await;
        r.map(|_| ())
    };
    if let (Err(e), _) | (_, Err(e)) = tokio::join!(up, down) {
        if e.kind() != std::io::ErrorKind::BrokenPipe && e.kind() != std::io::ErrorKind::ConnectionReset {
            tracing::debug!("registration connection ended: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdrs(list: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        list.iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn only_an_authority_that_is_a_path_is_replaced() {
        let mut h = hdrs(&[
            (
                ":authority",
                "/var/lib/kubelet/plugins_registry/vfio.gpupass.dev-reg.sock",
            ),
            (":path", "/pluginregistration.Registration/GetInfo"),
        ]);
        assert!(repair(&mut h));
        assert_eq!(h[0].1, b"localhost");
        assert_eq!(h[1].1, b"/pluginregistration.Registration/GetInfo");
        for ok in ["localhost", "127.0.0.1:10250", "[::1]:80", "dra.example"] {
            let mut h = hdrs(&[(":authority", ok)]);
            assert!(!repair(&mut h), "{ok}");
        }
    }

    #[test]
    fn literals_decode_back_and_long_integers_use_continuation_bytes() {
        let long = "x".repeat(300);
        let h = hdrs(&[(":method", "POST"), ("k", long.as_str()), ("", "")]);
        assert_eq!(hpack::Decoder::new().decode(&encode(&h)).unwrap(), h);
    }

    /// A client as grpc-go's passthrough dial writes it: the preface, SETTINGS, a HEADERS
    /// frame (padded, with priority, the block Huffman-free but indexed into the client's
    /// dynamic table) split over a CONTINUATION, DATA; then a second request whose block
    /// refers to the first one's table entries. The server side sees every frame but the
    /// header blocks byte for byte, and those with `localhost`.
    #[test]
    fn frames_pass_and_header_blocks_get_a_valid_authority() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut enc = hpack::Encoder::new();
            let sock = "/var/lib/kubelet/plugins_registry/vfio.gpupass.dev-reg.sock";
            let req = |path: &'static str| {
                vec![
                    (&b":method"[..], &b"POST"[..]),
                    (b":scheme", b"http"),
                    (b":path", path.as_bytes()),
                    (b":authority", sock.as_bytes()),
                    (b"content-type", b"application/grpc"),
                ]
            };
            let b1 = enc.encode(req("/pluginregistration.Registration/GetInfo"));
            let b2 = enc.encode(req("/pluginregistration.Registration/NotifyRegistrationStatus"));
            let mut wire = PREFACE.to_vec();
            wire.extend_from_slice(&frame_header(0, 0x4, 0, 0)); // SETTINGS
            let mut p = vec![2u8]; // pad length
            p.extend_from_slice(&[0, 0, 0, 0, 15]); // priority
            let (x, y) = b1.split_at(b1.len() / 2);
            p.extend_from_slice(x);
            p.extend_from_slice(&[0, 0]);
            wire.extend_from_slice(&frame_header(p.len(), HEADERS, PADDED | PRIORITY, 1));
            wire.extend_from_slice(&p);
            wire.extend_from_slice(&frame_header(y.len(), CONTINUATION, END_HEADERS, 1));
            wire.extend_from_slice(y);
            wire.extend_from_slice(&frame_header(5, 0x0, END_STREAM, 1)); // DATA
            wire.extend_from_slice(&[0, 0, 0, 0, 0]);
            wire.extend_from_slice(&frame_header(b2.len(), HEADERS, END_HEADERS, 3));
            wire.extend_from_slice(&b2);

            let (mut server_end, relay_end) = tokio::io::duplex(1 << 16);
            let up = client_to_server(&wire[..], relay_end);
            let mut got = Vec::new();
            let (r, _) = tokio::join!(up, server_end.read_to_end(&mut got));
            r.unwrap();

            assert_eq!(&got[..24], PREFACE);
            let mut rest = &got[24..];
            let mut frames = Vec::new();
            while let Some(f) = read_frame(&mut rest).await.unwrap() {
                frames.push(f);
            }
            let kinds: Vec<(u8, u8)> = frames.iter().map(|(h, _)| (h[3], h[4])).collect();
            assert_eq!(
                kinds,
                [
                    (0x4, 0),
                    (HEADERS, PRIORITY | END_HEADERS),
                    (0x0, END_STREAM),
                    (HEADERS, END_HEADERS)
                ]
            );
            assert_eq!(frames[1].1[..5], [0, 0, 0, 0, 15]);
            assert_eq!(frames[2].1, [0, 0, 0, 0, 0]);
            let mut dec = hpack::Decoder::new();
            for (f, path, skip) in [
                (&frames[1], "/pluginregistration.Registration/GetInfo", 5),
                (
                    &frames[3],
                    "/pluginregistration.Registration/NotifyRegistrationStatus",
                    0,
                ),
            ] {
                let h = dec.decode(&f.1[skip..]).unwrap();
                let get = |n: &str| h.iter().find(|(k, _)| k == n.as_bytes()).map(|(_, v)| v.clone());
                assert_eq!(get(":authority").as_deref(), Some(&b"localhost"[..]));
                assert_eq!(get(":path").as_deref(), Some(path.as_bytes()));
                assert_eq!(get("content-type").as_deref(), Some(&b"application/grpc"[..]));
            }
        });
    }
}
