//! Generates the gRPC clients and servers from `proto/*.proto`.
//!
//! protoc comes from the `protoc-bin-vendored` crate, so building needs no
//! system protobuf compiler; set `PROTOC` to use another one.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = ["inventory.proto", "payment.proto", "order.proto", "deadletter.proto"].map(|f| root.join(f));
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    tonic_prost_build::configure().compile_protos(&files, &[root])?;
    Ok(())
}
