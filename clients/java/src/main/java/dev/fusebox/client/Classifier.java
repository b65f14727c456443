package dev.fusebox.client;

import io.grpc.Status;
import java.util.concurrent.CancellationException;

/** Maps what a guarded call threw (never null) to the outcome reported for it. */
@FunctionalInterface
public interface Classifier {
  /** The outcome to report for a call that threw {@code error}. */
  Outcome classify(Throwable error);

  /**
   * Counts every exception as {@link Outcome#FAILURE} except cancellations, which are {@link
   * Outcome#IGNORED}: an {@link InterruptedException}, a {@link CancellationException}, or a gRPC
   * status with code {@code CANCELLED}. A deadline that passed counts: a slow dependency is
   * failing.
   */
  Classifier DEFAULT =
      error -> {
        if (error instanceof InterruptedException || error instanceof CancellationException) {
          return Outcome.IGNORED;
        }
        if (Status.fromThrowable(error).getCode() == Status.Code.CANCELLED) {
          return Outcome.IGNORED;
        }
        return Outcome.FAILURE;
      };
}
