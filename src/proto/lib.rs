//! Generated gRPC types for the wire contract (SPEC section 8), and the
//! conversions between them and the engine's values ([`wire`]).
//!
//! The code is generated at build time by `build.rs` from
//! `proto/fusebox/v1/fusebox.proto`, using `protox` (no system `protoc`) and
//! `tonic-prost-build`. `google.protobuf.Duration` maps to
//! [`prost_types::Duration`].

pub mod codec;
pub mod wire;

/// Package `fusebox.v1`: messages, enums, and the `Fusebox`, `Admin` and
/// `Clock` services (`*_server` and `*_client` modules).
#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    rustdoc::all
)]
pub mod v1 {
    tonic::include_proto!("fusebox.v1");
}

/// Encoded `google.protobuf.FileDescriptorSet` of the fusebox proto and its
/// imports (including `google/protobuf/duration.proto`), with source info.
///
/// Register it with `tonic_reflection::server::Builder::register_encoded_file_descriptor_set`
/// so that tools such as `grpcurl` can discover the services.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/fusebox_descriptor.bin"));
