//! Generates the gRPC clients and servers from `proto/*.proto`.
//!
//! protoc comes from the `protoc-bin-vendored` crate, so building needs no
//! system protobuf compiler; set `PROTOC` to use another one.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
    }
    // Read at run time, not with env!: a build script compiled in a target directory that
    // several checkouts share would otherwise keep the first checkout's path.
    let root =
        std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR unset")?)
            .join("../../proto");
    let files = ["inventory.proto", "payment.proto", "order.proto", "deadletter.proto"].map(|f| root.join(f));
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    tonic_prost_build::configure().compile_protos(&files, &[root])?;
    Ok(())
}
