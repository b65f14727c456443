package dev.fusebox.client;


/** How a guarded call went, as reported to fusebox. */
public enum Outcome {
  /** The dependency worked. */
  SUCCESS(dev.fusebox.v1.Outcome.OUTCOME_SUCCESS),
  /** The dependency failed; counts toward tripping the breaker. */
  FAILURE(dev.fusebox.v1.Outcome.OUTCOME_FAILURE),
  /** Says nothing about the dependency (a cancellation). */
  IGNORED(dev.fusebox.v1.Outcome.OUTCOME_IGNORED);

  final dev.fusebox.v1.Outcome proto;

  Outcome(dev.fusebox.v1.Outcome proto) {
    this.proto = proto;
  }
}
