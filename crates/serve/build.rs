//! Compiles `proto/inference.proto` (the KServe V2 gRPC service) into
//! Rust with protox, a protobuf compiler written in Rust: the build needs
//! no `protoc` binary, so nothing is downloaded and CI builds it offline.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/inference.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        // `bytes::Bytes` for the raw tensor contents: decoded without a copy
        .bytes(".inference")
        .compile_fds(fds)?;
    Ok(())
}
