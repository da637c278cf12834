//! One DRA call as the kubelet makes it, on a running `gpupass dra-plugin`'s service socket:
//! `kubelet_call SOCKET prepare|unprepare NAMESPACE NAME UID`. Prints each claim's result
//! (its devices' CDI IDs, or its error) and exits 1 when the claim failed. For
//! `benches/scancount.sh`, which counts the host reads of one request end to end on the real
//! binary; the kubelet of the lab (lab/scenarios/drabench.sh) makes the same call on a real
//! node.

use gpupass::containers::kubelet::proto::v1;
use gpupass::containers::kubelet::socket::connect_unix;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [socket, call, namespace, name, uid] = &args[..] else {
        eprintln!("usage: kubelet_call SOCKET prepare|unprepare NAMESPACE NAME UID");
        return ExitCode::from(2);
    };
    let claim = v1::Claim {
        namespace: namespace.clone(),
        uid: uid.clone(),
        name: name.clone(),
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kubelet_call: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let socket = PathBuf::from(socket);
    let r: Result<String, String> = rt.block_on(async {
        let ch = connect_unix(&socket)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
        let mut dra = v1::dra_plugin_client::DraPluginClient::new(ch);
        match call.as_str() {
            "prepare" => {
                let r = dra
                    .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![claim] })
                    .await
                    .map_err(|s| format!("NodePrepareResources: {s}"))?
                    .into_inner();
                let c = r.claims.get(uid).ok_or("no result for the claim")?;
                if !c.error.is_empty() {
                    return Err(c.error.clone());
                }
                let ids: Vec<String> = c.devices.iter().flat_map(|d| d.cdi_device_ids.clone()).collect();
                Ok(format!("prepared {namespace}/{name}: {}", ids.join(" ")))
            }
            "unprepare" => {
                let r = dra
                    .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![claim] })
                    .await
                    .map_err(|s| format!("NodeUnprepareResources: {s}"))?
                    .into_inner();
                let c = r.claims.get(uid).ok_or("no result for the claim")?;
                if !c.error.is_empty() {
                    return Err(c.error.clone());
                }
                Ok(format!("unprepared {namespace}/{name}"))
            }
            other => Err(format!("unknown call {other:?}: prepare or unprepare")),
        }
    });
    match r {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kubelet_call: {e}");
            ExitCode::FAILURE
        }
    }
}
