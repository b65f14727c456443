package dev.fusebox.client;

import dev.fusebox.v1.FuseboxGrpc;
import dev.fusebox.v1.AcquireRequest;
import dev.fusebox.v1.AcquireResponse;
import dev.fusebox.v1.CancelRequest;
import dev.fusebox.v1.CompleteRequest;
import dev.fusebox.v1.CompleteResponse;
import dev.fusebox.v1.DecideFrame;
import dev.fusebox.v1.DecideRequest;
import dev.fusebox.v1.DecideResponse;
import dev.fusebox.v1.DecideResult;
import dev.fusebox.v1.ItemError;
import dev.fusebox.v1.RenewRequest;
import dev.fusebox.v1.RenewResponse;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.StreamObserver;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.Executor;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;

/**
 * A client's calls multiplexed over one {@code Decide} stream ({@link Transport#STREAM}): each call
 * is a frame with an id of its own, the frames ready together go out in one message, and each
 * answer is handed to its caller by id. The stream is opened on the first call and again after it
 * ends; the calls in flight on it then fail UNAVAILABLE, as a broken unary call would. A call whose
 * deadline passes fails DEADLINE_EXCEEDED; a waiting Acquire is then withdrawn with a Cancel frame
 * of its id, as it is when its future is cancelled.
 */
final class DecideStream {
  /** Frames sent in one message at most (the server's limit). */
  static final int FRAMES_PER_MESSAGE = 1000;

  private final Channel channel;
  private final AtomicLong nextId = new AtomicLong(1);
  private Open open; // guarded by this

  DecideStream(Channel channel) {
    this.channel = channel;
  }

  CompletableFuture<AcquireResponse> acquire(AcquireRequest req, long deadlineNanos, Executor executor) {
    return call(
        DecideFrame.newBuilder().setAcquire(req),
        true,
        r -> r.getResultCase() == DecideResult.ResultCase.ACQUIRE ? r.getAcquire() : null,
        deadlineNanos,
        executor);
  }

  CompletableFuture<CompleteResponse> complete(CompleteRequest req, long deadlineNanos, Executor executor) {
    return call(
        DecideFrame.newBuilder().setComplete(req),
        false,
        r -> r.getResultCase() == DecideResult.ResultCase.COMPLETE ? r.getComplete() : null,
        deadlineNanos,
        executor);
  }

  CompletableFuture<RenewResponse> renew(RenewRequest req, long deadlineNanos, Executor executor) {
    return call(
        DecideFrame.newBuilder().setRenew(req),
        false,
        r -> r.getResultCase() == DecideResult.ResultCase.RENEW ? r.getRenew() : null,
        deadlineNanos,
        executor);
  }

  /** The open stream, opening one if there is none or it ended. */
  private synchronized Open stream() {
    if (open == null || open.ended) {
      open = new Open();
      open.start();
    }
    return open;
  }

  /** Forgets {@code o} if it is still the open stream. */
  private synchronized void forget(Open o) {
    if (open == o) {
      open = null;
    }
  }

  /**
   * Sends {@code frame} (its request set) and completes the future with its answer, picked by
   * {@code answer} (null: an answer of the wrong kind); callbacks run on {@code executor} (null:
   * a pool of the library's, never the stream's own thread).
   */
  private <R> CompletableFuture<R> call(
      DecideFrame.Builder frame,
      boolean cancellable,
      Function<DecideResult, R> answer,
      long deadlineNanos,
      Executor executor) {
    long id = nextId.getAndIncrement();
    CompletableFuture<R> future = new CompletableFuture<>();
    Open o = stream();
    Waiter w =
        new Waiter(
            result -> {
              if (result.getResultCase() == DecideResult.ResultCase.ERROR) {
                return statusOf(result.getError()).asRuntimeException();
              }
              R r = answer.apply(result);
              if (r == null) {
                return Status.INTERNAL
                    .withDescription(
                        "fusebox answered a frame with " + result.getResultCase() + ", not the answer of its kind")
                    .asRuntimeException();
              }
              future.complete(r);
              return null;
            },
            future::completeExceptionally,
            executor);
    o.pending.put(id, w);
    w.timer =
        Rpc.SCHEDULER.schedule(
            () -> {
              if (o.pending.remove(id, w)) {
                if (cancellable) {
                  o.send(cancelFrame(id));
                }
                w.fail(Status.DEADLINE_EXCEEDED.withDescription("fusebox did not answer in time").asRuntimeException());
              }
            },
            deadlineNanos,
            TimeUnit.NANOSECONDS);
    future.whenComplete(
        (r, e) -> {
          if (e instanceof CancellationException && o.pending.remove(id, w)) {
            w.stopTimer();
            if (cancellable) {
              o.send(cancelFrame(id));
            }
          }
        });
    if (o.ended && o.pending.remove(id, w)) { // it ended before the frame was in: no answer will come
      w.stopTimer();
      w.fail(streamEnded());
      return future;
    }
    o.send(frame.setId(id).build());
    return future;
  }

  private static DecideFrame cancelFrame(long id) {
    return DecideFrame.newBuilder().setId(id).setCancel(CancelRequest.getDefaultInstance()).build();
  }

  /** An error answer as the status the unary call would have failed with. */
  static Status statusOf(ItemError e) {
    return Status.fromCodeValue(e.getCode()).withDescription(e.getMessage());
  }

  private static StatusRuntimeException streamEnded() {
    return Status.UNAVAILABLE
        .withDescription("the Decide stream ended before fusebox answered")
        .asRuntimeException();
  }

  /** A caller waiting for the answer to its frame. */
  private static final class Waiter {
    /** Completes the caller's future with a result; returns the error to fail it with instead. */
    final Function<DecideResult, Throwable> answered;

    final java.util.function.Consumer<Throwable> failed;
    final Executor executor;
    volatile ScheduledFuture<?> timer;

    Waiter(
        Function<DecideResult, Throwable> answered,
        java.util.function.Consumer<Throwable> failed,
        Executor executor) {
      this.answered = answered;
      this.failed = failed;
      this.executor = executor != null ? executor : Rpc.CALLBACKS;
    }

    void stopTimer() {
      ScheduledFuture<?> t = timer;
      if (t != null) {
        t.cancel(false);
      }
    }

    void answer(DecideResult r) {
      executor.execute(
          () -> {
            Throwable e = answered.apply(r);
            if (e != null) {
              failed.accept(e);
            }
          });
    }

    void fail(Throwable e) {
      executor.execute(() -> failed.accept(e));
    }
  }

  /** One Decide stream: its sending side, its frames not sent yet and its callers waiting. */
  private final class Open implements StreamObserver<DecideResponse> {
    final Map<Long, Waiter> pending = new ConcurrentHashMap<>();
    private final ConcurrentLinkedQueue<DecideFrame> queue = new ConcurrentLinkedQueue<>();
    private final AtomicBoolean sending = new AtomicBoolean();
    private StreamObserver<DecideRequest> requests;
    volatile boolean ended;

    void start() {
      ClientCall<DecideRequest, DecideResponse> call =
          channel.newCall(FuseboxGrpc.getDecideMethod(), CallOptions.DEFAULT);
      requests = ClientCalls.asyncBidiStreamingCall(call, this);
    }

    /**
     * Queues {@code frame}; the queued frames are sent by one task at a time, up to {@value
     * #FRAMES_PER_MESSAGE} a message, so that the frames queued while it runs go out together.
     */
    void send(DecideFrame frame) {
      queue.add(frame);
      if (sending.compareAndSet(false, true)) {
        Rpc.CALLBACKS.execute(this::drain);
      }
    }

    private void drain() {
      do {
        try {
          while (!queue.isEmpty()) {
            List<DecideFrame> batch = new ArrayList<>();
            DecideFrame f;
            while (batch.size() < FRAMES_PER_MESSAGE && (f = queue.poll()) != null) {
              batch.add(f);
            }
            if (ended || batch.isEmpty()) {
              continue; // their callers fail with the stream
            }
            try {
              requests.onNext(DecideRequest.newBuilder().addAllFrames(batch).build());
            } catch (RuntimeException e) {
              onError(e);
            }
          }
        } finally {
          sending.set(false);
        }
        // A frame queued after the last poll and before the flag was down has no task of its own.
      } while (!queue.isEmpty() && sending.compareAndSet(false, true));
    }

    @Override
    public void onNext(DecideResponse message) {
      for (DecideResult r : message.getResultsList()) {
        Waiter w = pending.remove(r.getId());
        if (w != null) {
          w.stopTimer();
          w.answer(r);
        }
      }
    }

    @Override
    public void onError(Throwable t) {
      end();
    }

    @Override
    public void onCompleted() {
      end();
    }

    private void end() {
      ended = true;
      forget(this);
      for (Long id : new ArrayList<>(pending.keySet())) {
        Waiter w = pending.remove(id);
        if (w != null) {
          w.stopTimer();
          w.fail(streamEnded());
        }
      }
    }
  }
}
