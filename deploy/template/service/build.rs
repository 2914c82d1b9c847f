//! Generates this service's gRPC server (and client, for tests and callers) from
//! `proto/{{name}}.proto`.
//!
//! protoc comes from the `protoc-bin-vendored` crate, so building needs no system
//! protobuf compiler; set `PROTOC` to use another one.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
    }
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure().compile_protos(&["proto/{{name}}.proto"], &["proto"])?;
    Ok(())
}
