//! Compiles the repository's `proto/fusebox/v1/fusebox.proto` and the vendored
//! Envoy rate-limit service (`proto/envoy/service/ratelimit/v3/rls.proto`, a
//! subset of Envoy's data-plane API) without a system `protoc`.
//!
//! `protox` parses the proto (well-known types such as
//! `google/protobuf/duration.proto` are built in) into a `FileDescriptorSet`.
//! That set is written to `$OUT_DIR/fusebox_descriptor.bin` for
//! `tonic-reflection`, and handed to `tonic-prost-build` to generate the
//! message types plus client and server code. Well-known types map to
//! `prost_types` (prost-build's default extern path for `.google.protobuf`).

use std::path::PathBuf;

const PROTO: &str = "../../proto/fusebox/v1/fusebox.proto";
const RLS: &str = "../../proto/envoy/service/ratelimit/v3/rls.proto";
const INCLUDE: &str = "../../proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed={RLS}");
    println!("cargo:rerun-if-changed={INCLUDE}");

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    let mut compiler = protox::Compiler::new([INCLUDE])?;
    compiler
        .include_source_info(true)
        .include_imports(true)
        .open_files([PROTO, RLS])?;

    // Encoded set (with imports and doc comments) for server reflection.
    std::fs::write(
        out_dir.join("fusebox_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .emit_rerun_if_changed(false)
        // Decode errors name the field and are INVALID_ARGUMENT.
        .codec_path("crate::codec::Codec")
        .compile_fds(compiler.file_descriptor_set())?;

    Ok(())
}
