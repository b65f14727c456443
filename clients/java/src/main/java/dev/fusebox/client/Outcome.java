package dev.fusebox.client;

import fusebox.v1.FuseboxOuterClass;

/** How a guarded call went, as reported to fusebox. */
public enum Outcome {
  /** The dependency worked. */
  SUCCESS(FuseboxOuterClass.Outcome.OUTCOME_SUCCESS),
  /** The dependency failed; counts toward tripping the breaker. */
  FAILURE(FuseboxOuterClass.Outcome.OUTCOME_FAILURE),
  /** Says nothing about the dependency (a cancellation). */
  IGNORED(FuseboxOuterClass.Outcome.OUTCOME_IGNORED);

  final FuseboxOuterClass.Outcome proto;

  Outcome(FuseboxOuterClass.Outcome proto) {
    this.proto = proto;
  }
}
