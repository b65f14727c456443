// The fusebox contract, loaded at run time from the proto file shipped in
// the package (proto/fusebox/v1/fusebox.proto), with the TypeScript types
// generated from it at build time by proto-loader-gen-types.
import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

import type { ProtoGrpcType } from './generated/fusebox';
import type { Duration, Duration__Output } from './generated/google/protobuf/Duration';

export type { FuseboxClient as FuseboxStub } from './generated/fusebox/v1/Fusebox';
export type { AdminClient as AdminStub } from './generated/fusebox/v1/Admin';
export type { ClockClient as ClockStub } from './generated/fusebox/v1/Clock';
export type { AcquireRequest } from './generated/fusebox/v1/AcquireRequest';
export type { AcquireResponse__Output as AcquireResponse } from './generated/fusebox/v1/AcquireResponse';
export type { KeyState__Output as KeyState } from './generated/fusebox/v1/KeyState';
export type { KeyStats__Output as KeyStats } from './generated/fusebox/v1/KeyStats';
export type { Policy } from './generated/fusebox/v1/Policy';
export type { Duration, Duration__Output } from './generated/google/protobuf/Duration';

/** Where the contract lives in the package. */
export const PROTO_FILE = path.join(__dirname, '..', 'proto', 'fusebox', 'v1', 'fusebox.proto');

/** The options the generated types were made with (see the build script). */
export const LOADER_OPTIONS: protoLoader.Options = {
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
};

let loaded: ProtoGrpcType | undefined;

/** The loaded contract: service constructors for Fusebox, Admin and Clock. */
export function proto(): ProtoGrpcType {
  if (loaded === undefined) {
    const def = protoLoader.loadSync(PROTO_FILE, LOADER_OPTIONS);
    loaded = grpc.loadPackageDefinition(def) as unknown as ProtoGrpcType;
  }
  return loaded;
}

/** Milliseconds as a google.protobuf.Duration. */
export function duration(ms: number): Duration {
  const whole = Math.max(0, Math.ceil(ms));
  return { seconds: Math.floor(whole / 1000), nanos: (whole % 1000) * 1_000_000 };
}

/** A google.protobuf.Duration as milliseconds (null when absent). */
export function millis(d: Duration__Output | null | undefined): number | null {
  if (d === null || d === undefined) {
    return null;
  }
  return Number(d.seconds) * 1000 + Math.round(d.nanos / 1_000_000);
}
