//! Build script (Cargo.toml: `build = "schemas/build.rs"`): generates the Pulsar protocol types
//! from `schemas/pulsar/PulsarApi.proto` with a pure-Rust protobuf compiler (protox), so no
//! system `protoc` is needed to build ledgerlake.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=schemas/pulsar/PulsarApi.proto");
    let descriptors = protox::compile(["PulsarApi.proto"], ["schemas/pulsar"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
