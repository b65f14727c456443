package dev.fusebox.client;

import dev.fusebox.v1.FuseboxGrpc;
import dev.fusebox.v1.AcquireRequest;
import dev.fusebox.v1.AcquireResponse;
import dev.fusebox.v1.CancelRequest;
import dev.fusebox.v1.CompleteRequest;
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
import java.util.Arrays;
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
import java.util.concurrent.atomic.AtomicInteger;
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

  /**
   * Sends {@code reqs} (at most {@value #FRAMES_PER_MESSAGE}) as complete frames together in one
   * message. The future ends when every frame has its answer, its deadline passed or the stream
   * ended: per request, null when it was answered, else why it was not. It is
   * completed on the thread that handled the last answer (the stream's callback, the deadline's
   * timer), so its dependent stages must not block.
   */
  CompletableFuture<List<OutcomeQueue.Failed>> completeAll(List<CompleteRequest> reqs, long deadlineNanos) {
    int n = reqs.size();
    if (n == 0 || n > FRAMES_PER_MESSAGE) {
      throw new IllegalArgumentException("complete frames in one message: 1 to " + FRAMES_PER_MESSAGE + ", not " + n);
    }
    OutcomeQueue.Failed[] errors = new OutcomeQueue.Failed[n];
    AtomicInteger left = new AtomicInteger(n);
    CompletableFuture<List<OutcomeQueue.Failed>> future = new CompletableFuture<>();
    Open o = stream();
    long first = nextId.getAndAdd(n);
    Waiter[] waiters = new Waiter[n];
    List<DecideFrame> frames = new ArrayList<>(n);
    for (int i = 0; i < n; i++) {
      int at = i;
      Runnable counted =
          () -> {
            if (left.decrementAndGet() == 0) {
              future.complete(Arrays.asList(errors));
            }
          };
      waiters[i] =
          new Waiter(
              result -> {
                if (result.getResultCase() == DecideResult.ResultCase.ERROR) {
                  errors[at] = new OutcomeQueue.Failed(statusOf(result.getError()), true);
                } else if (result.getResultCase() != DecideResult.ResultCase.COMPLETE) {
                  errors[at] =
                      new OutcomeQueue.Failed(
                          Status.INTERNAL.withDescription(
                              "fusebox answered a complete frame with " + result.getResultCase()),
                          true);
                }
                counted.run();
                return null;
              },
              e -> { // no answer: the deadline passed or the stream ended
                errors[at] = new OutcomeQueue.Failed(Status.fromThrowable(e), false);
                counted.run();
              },
              Rpc.DIRECT);
      o.pending.put(first + i, waiters[i]);
      frames.add(DecideFrame.newBuilder().setId(first + i).setComplete(reqs.get(i)).build());
    }
    Runnable expire =
        () -> {
          for (int i = 0; i < n; i++) {
            if (o.pending.remove(first + i, waiters[i])) {
              waiters[i].fail(
                  Status.DEADLINE_EXCEEDED.withDescription("fusebox did not answer in time").asRuntimeException());
            }
          }
        };
    ScheduledFuture<?> timer = Rpc.SCHEDULER.schedule(expire, deadlineNanos, TimeUnit.NANOSECONDS);
    future.whenComplete((r, e) -> timer.cancel(false));
    if (o.ended) { // it ended before the frames were in: no answer will come
      for (int i = 0; i < n; i++) {
        if (o.pending.remove(first + i, waiters[i])) {
          waiters[i].fail(streamEnded());
        }
      }
      return future;
    }
    o.send(frames);
    return future;
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
                  o.send(List.of(cancelFrame(id)));
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
              o.send(List.of(cancelFrame(id)));
            }
          }
        });
    if (o.ended && o.pending.remove(id, w)) { // it ended before the frame was in: no answer will come
      w.stopTimer();
      w.fail(streamEnded());
      return future;
    }
    o.send(List.of(frame.setId(id).build()));
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
    private final ConcurrentLinkedQueue<List<DecideFrame>> queue = new ConcurrentLinkedQueue<>();
    private final AtomicBoolean sending = new AtomicBoolean();
    private StreamObserver<DecideRequest> requests;
    volatile boolean ended;

    void start() {
      ClientCall<DecideRequest, DecideResponse> call =
          channel.newCall(FuseboxGrpc.getDecideMethod(), CallOptions.DEFAULT);
      requests = ClientCalls.asyncBidiStreamingCall(call, this);
    }

    /**
     * Queues {@code frames} (at most {@value #FRAMES_PER_MESSAGE}), to go out together in one
     * message; the queued frames are sent by one task at a time, up to {@value
     * #FRAMES_PER_MESSAGE} a message, so that the frames queued while it runs go out together.
     */
    void send(List<DecideFrame> frames) {
      queue.add(frames);
      if (sending.compareAndSet(false, true)) {
        Rpc.CALLBACKS.execute(this::drain);
      }
    }

    private void drain() {
      do {
        try {
          while (!queue.isEmpty()) {
            // Only this task takes from the queue: what it peeks is what it polls.
            List<DecideFrame> batch = new ArrayList<>();
            List<DecideFrame> group;
            while ((group = queue.peek()) != null && batch.size() + group.size() <= FRAMES_PER_MESSAGE) {
              queue.poll();
              batch.addAll(group);
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
