//! Compiles proto/deviceplugin/v1beta1/api.proto (the kubelet device-plugin API) with protox,
//! a pure-Rust protobuf compiler, so no `protoc` is needed; tonic-prost-build generates the
//! messages and both the client and server stubs into OUT_DIR.

fn main() {
    let proto = "proto/deviceplugin/v1beta1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"]).unwrap_or_else(|e| panic!("{proto}: {e}"));
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating code for {proto}: {e}"));
}
