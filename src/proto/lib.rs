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

/// Envoy's rate-limit service protocol (RLS v3), vendored under
/// `proto/envoy` (a subset of Envoy's data-plane API with the upstream
/// package, message and field names and numbers, so the wire is Envoy's).
/// The modules mirror the proto packages, as the generated code refers to
/// its imports by relative paths.
#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    rustdoc::all
)]
pub mod envoy {
    /// Package `envoy.config.core.v3` (only `HeaderValue`).
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    /// Package `envoy.extensions.common.ratelimit.v3` (only `RateLimitDescriptor`).
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    /// Package `envoy.service.ratelimit.v3`: `RateLimitService/ShouldRateLimit`.
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
    /// Package `envoy.type.v3` (only `RateLimitUnit`).
    pub mod r#type {
        pub mod v3 {
            include!(concat!(env!("OUT_DIR"), "/envoy.r#type.v3.rs"));
        }
    }
}

/// Encoded `google.protobuf.FileDescriptorSet` of the fusebox and Envoy RLS
/// protos and their imports (including `google/protobuf/duration.proto`), with source info.
///
/// Register it with `tonic_reflection::server::Builder::register_encoded_file_descriptor_set`
/// so that tools such as `grpcurl` can discover the services.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/fusebox_descriptor.bin"));
