package dev.fusebox.client;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.MethodDescriptor;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.StreamObserver;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/** Unary calls to fusebox as futures, and the executors the library shares. */
final class Rpc {
  private Rpc() {}

  /** Runs callbacks on the thread that completes the call (they are all short). */
  static final Executor DIRECT = Runnable::run;

  /** Renewal timers and reconnection nudges of every client in the process (daemon threads). */
  static final ScheduledThreadPoolExecutor SCHEDULER = scheduler();

  /**
   * Sends the frames of Decide streams and completes the futures of stream calls made without an
   * executor, so that their dependent stages may block without holding up the stream's other
   * answers (daemon threads).
   */
  static final Executor CALLBACKS =
      java.util.concurrent.Executors.newCachedThreadPool(
          new ThreadFactory() {
            private final AtomicInteger n = new AtomicInteger();

            @Override
            public Thread newThread(Runnable r) {
              Thread t = new Thread(r, "fusebox-callback-" + n.incrementAndGet());
              t.setDaemon(true);
              return t;
            }
          });

  private static ScheduledThreadPoolExecutor scheduler() {
    AtomicInteger n = new AtomicInteger();
    ThreadFactory f =
        r -> {
          Thread t = new Thread(r, "fusebox-timer-" + n.incrementAndGet());
          t.setDaemon(true);
          return t;
        };
    ScheduledThreadPoolExecutor s = new ScheduledThreadPoolExecutor(1, f);
    s.setRemoveOnCancelPolicy(true);
    return s;
  }

  /**
   * Starts a unary call with a deadline; cancelling the future cancels the call. Callbacks run on
   * {@code executor}, or gRPC's default executor when it is null.
   */
  static <Q, R> CompletableFuture<R> call(
      Channel channel, MethodDescriptor<Q, R> method, Q request, long deadlineNanos, Executor executor) {
    CallOptions options = CallOptions.DEFAULT.withDeadlineAfter(deadlineNanos, TimeUnit.NANOSECONDS);
    if (executor != null) {
      options = options.withExecutor(executor);
    }
    ClientCall<Q, R> call = channel.newCall(method, options);
    CompletableFuture<R> future = new CompletableFuture<>();
    future.whenComplete(
        (r, e) -> {
          if (e instanceof CancellationException) {
            call.cancel("cancelled by the caller", null);
          }
        });
    ClientCalls.asyncUnaryCall(
        call,
        request,
        new StreamObserver<R>() {
          private R value;

          @Override
          public void onNext(R v) {
            value = v;
          }

          @Override
          public void onError(Throwable t) {
            future.completeExceptionally(t);
          }

          @Override
          public void onCompleted() {
            future.complete(value);
          }
        });
    return future;
  }
}
