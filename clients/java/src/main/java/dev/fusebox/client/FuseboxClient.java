package dev.fusebox.client;

import com.google.protobuf.Duration;
import dev.fusebox.v1.FuseboxGrpc;
import dev.fusebox.v1.AcquireRequest;
import dev.fusebox.v1.AcquireResponse;
import dev.fusebox.v1.CompleteBatchRequest;
import dev.fusebox.v1.CompleteBatchResponse;
import dev.fusebox.v1.CompleteRequest;
import dev.fusebox.v1.CompleteResult;
import dev.fusebox.v1.Reason;
import dev.fusebox.v1.RenewRequest;
import dev.fusebox.v1.RenewResponse;
import io.grpc.CallOptions;
import io.grpc.ChannelCredentials;
import io.grpc.ConnectivityState;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.MetadataUtils;
import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.Callable;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.LongSupplier;
import java.util.function.Supplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Guards calls to dependencies with fusebox: asks before the call ({@code Acquire}), runs it when
 * admitted, reports how it went ({@code Complete}) and renews the lease of a long call. One client
 * holds one gRPC channel and is safe for concurrent use: make one per process, or use {@link
 * #shared(String)}.
 *
 * <pre>{@code
 * FuseboxClient client = FuseboxClient.builder("127.0.0.1:7700").token(System.getenv("FUSEBOX_TOKEN")).build();
 * try {
 *   String receipt = client.guard("payments/charge", () -> charge(order));
 * } catch (BlockedException e) {
 *   retryLater(e.retryAfter()); // the call was not made
 * }
 * }</pre>
 */
public final class FuseboxClient implements AutoCloseable {
  /** How long a guard waits for fusebox itself (Acquire, Complete, Renew) by default. */
  public static final java.time.Duration DEFAULT_DEADLINE = java.time.Duration.ofMillis(50);

  /** The default bound of the local short-circuit cache (keys known OPEN). */
  public static final int DEFAULT_CACHE_SIZE = 1024;

  /** The least time between two log lines about the same kind of trouble, by default. */
  public static final java.time.Duration DEFAULT_LOG_INTERVAL = java.time.Duration.ofSeconds(10);

  /** How many outcomes wait to be reported at most, by default (see {@link Builder#outcomeQueue}). */
  public static final int DEFAULT_OUTCOME_QUEUE = OutcomeQueue.DEFAULT_CAPACITY;

  /** The least time a report of outcomes, or {@link #close()}'s flush, is given. */
  static final long LEAST_REPORT_DEADLINE = TimeUnit.SECONDS.toNanos(1);

  static final Logger LOG = LoggerFactory.getLogger("dev.fusebox.client");

  private static final Map<String, FuseboxClient> SHARED = new ConcurrentHashMap<>();
  private static final ThreadLocal<Admission> CURRENT = new ThreadLocal<>();

  private final String target;
  private final ManagedChannel channel;
  private final long deadlineNanos;
  private final FailPolicy failPolicy;
  private final OpenCache cache;
  private final LongSupplier ticker;
  private final Reconnector reconnector;
  private final DecideStream stream;
  private final OutcomeQueue outcomes;
  private final String caller;
  final OutageBackoff backoff = new OutageBackoff();
  final LogLimiter logs;
  final Counters counters = new Counters();

  private FuseboxClient(Builder b) {
    this.target = b.target;
    ManagedChannelBuilder<?> cb = Grpc.newChannelBuilder(b.target, b.credentials);
    if (b.authority != null) {
      cb.overrideAuthority(b.authority);
    }
    if (b.token != null) {
      Metadata md = new Metadata();
      md.put(Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER), "Bearer " + b.token);
      cb.intercept(MetadataUtils.newAttachHeadersInterceptor(md));
    }
    if (b.interceptor != null) {
      cb.intercept(b.interceptor);
    }
    this.channel = cb.build();
    this.deadlineNanos = b.deadline.toNanos();
    this.failPolicy = b.failPolicy;
    this.caller = b.caller;
    this.cache = new OpenCache(b.cacheSize);
    this.ticker = b.ticker;
    this.logs = new LogLimiter(b.logger, b.logInterval.toNanos());
    this.reconnector = new Reconnector(channel);
    this.stream = b.transport == Transport.STREAM ? new DecideStream(channel) : null;
    this.outcomes =
        new OutcomeQueue(b.outcomeQueue, reportDeadline(), this::callCompleteAll, counters, logs);
    // Connect now, so that the first guard's small deadline is not spent on the handshake.
    reconnector.start();
  }

  /** A builder of a client for the server at {@code target} ({@code host:port} or a gRPC target). */
  public static Builder builder(String target) {
    return new Builder(target);
  }

  /**
   * The process's client for {@code target}, made with the defaults on first use; later calls for
   * the same target return the same client (and channel). See {@link Builder#shared()}.
   */
  public static FuseboxClient shared(String target) {
    return builder(target).shared();
  }

  /** The admission of the guarded call running on this thread, inside {@link #guard}. */
  public static Optional<Admission> admission() {
    return Optional.ofNullable(CURRENT.get());
  }

  /** The client's channel, for the generated Admin and Clock stubs. */
  public ManagedChannel channel() {
    return channel;
  }

  /** How the client's calls reach fusebox. */
  public Transport transport() {
    return stream != null ? Transport.STREAM : Transport.UNARY;
  }

  /** A snapshot of the client's counters. */
  public Stats stats() {
    return counters.snapshot();
  }

  /** Drops the local short-circuit entry of {@code key}: the next guard asks the server again. */
  public void forget(String key) {
    cache.forget(key);
  }

  /**
   * Waits until every outcome queued before this call (by guards that returned, tickets
   * completed) has been answered by fusebox, or has failed and been counted; at most {@code
   * timeout}. Guards report outcomes in the background, so a caller whose next call must see its
   * last outcome (a concurrency limit of one, used by one process), or a program about to exit,
   * flushes first.
   *
   * @return true when they all were answered, false when {@code timeout} passed first
   * @throws InterruptedException the thread was interrupted while waiting (the outcomes are still
   *     reported)
   */
  public boolean flush(java.time.Duration timeout) throws InterruptedException {
    Objects.requireNonNull(timeout, "timeout");
    return outcomes.flush(Math.max(0, saturatedNanos(timeout)));
  }

  /**
   * Flushes the outcomes queued so far (within the client's deadline, at least 1 s; see {@link
   * #flush}), then closes the channel and drops the client from the shared ones. An interrupt
   * cuts the flush short (and is kept). Outcomes queued after this fail and are counted in {@link
   * Stats#completeFailures()}.
   */
  @Override
  public void close() {
    SHARED.remove(target, this);
    try {
      if (!outcomes.flush(reportDeadline())) {
        logs.warn(
            "close",
            "fusebox: closing the client before fusebox answered every outcome reported; those"
                + " tickets' leases will end on the server, which counts them as expired");
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    channel.shutdownNow();
  }

  /** The deadline of a report of outcomes, and of close's flush: the client's, at least 1 s. */
  private long reportDeadline() {
    return Math.max(deadlineNanos, LEAST_REPORT_DEADLINE);
  }

  private static long saturatedNanos(java.time.Duration d) {
    try {
      return d.toNanos();
    } catch (ArithmeticException e) {
      return d.isNegative() ? Long.MIN_VALUE : Long.MAX_VALUE;
    }
  }

  /** Queues a ticket's outcome for the sender; never waits on the network. */
  void report(String key, String ticket, Outcome outcome, long cost) {
    outcomes.add(new OutcomeQueue.Item(key, ticket, outcome, cost));
  }

  /** Guards {@code call} for {@code key} with the default options. */
  public <T> T guard(String key, Callable<T> call) throws Exception {
    return guard(key, GuardOptions.defaults(), call);
  }

  /**
   * Asks fusebox before running {@code call} for {@code key}, runs it when admitted and reports how
   * it went: SUCCESS when it returns, the classifier's outcome for an exception (FAILURE unless it
   * is a cancellation), IGNORED when the thread was interrupted (the caller cancelled). The call's
   * own exception is thrown unchanged. The outcome is reported in the background: the guard queues
   * it and returns at once (see {@link #flush}).
   *
   * @throws BlockedException the breaker is open or its probe is running; the call was not made
   * @throws RefusedException the key is isolated; the call was not made
   * @throws DeniedException the permit book said no; the call was not made
   * @throws UnavailableException fusebox could not be asked in time and the policy is {@link
   *     FailPolicy#CLOSED}; the call was not made (with {@link FailPolicy#OPEN} it runs without a
   *     ticket and {@link Admission#failedOpen()} says so)
   * @throws FuseboxRequestException fusebox rejected the request (bad key, unauthenticated, ...)
   * @throws CancellationException the thread was interrupted while asking fusebox (the interrupt
   *     is kept)
   * @throws Exception whatever {@code call} throws
   */
  public <T> T guard(String key, GuardOptions opts, Callable<T> call) throws Exception {
    Ticket t = acquire(key, opts);
    Admission outer = CURRENT.get();
    CURRENT.set(t.admission());
    T value;
    try {
      value = call.call();
    } catch (Throwable e) {
      CURRENT.set(outer);
      t.failure(e);
      throw e;
    }
    CURRENT.set(outer);
    t.succeeded(value);
    return value;
  }

  /**
   * Asks fusebox for an admission to {@code key}, for a call the caller makes itself; see {@link
   * Ticket}. Throws what {@link #guard(String, GuardOptions, Callable)} throws before the call.
   */
  public Ticket acquire(String key, GuardOptions opts) {
    Objects.requireNonNull(key, "key");
    Objects.requireNonNull(opts, "opts");
    blockedLocally(key);
    if (Thread.currentThread().isInterrupted()) {
      throw new CancellationException("interrupted before asking fusebox");
    }
    if (stream == null) {
      return acquireUnary(key, opts);
    }
    CompletableFuture<AcquireResponse> f = startAcquire(key, opts, Rpc.DIRECT);
    AcquireResponse resp = null;
    Throwable err = null;
    try {
      resp = f.get();
    } catch (InterruptedException e) {
      f.cancel(true);
      Thread.currentThread().interrupt();
      throw new CancellationException("interrupted while asking fusebox");
    } catch (ExecutionException e) {
      err = e.getCause();
    }
    return decide(key, opts, resp, err);
  }

  /**
   * Guards an asynchronous call: asks fusebox, then starts {@code call} when admitted and reports
   * how its future ended (SUCCESS, the classifier's outcome, IGNORED when cancelled). The returned
   * future fails with the refusals of {@link #guard(String, GuardOptions, Callable)} or the call's
   * own exception; cancelling it cancels the call's future and reports IGNORED. {@code call} runs
   * on a gRPC executor thread (on the caller's when answered without asking fusebox), where {@link
   * #admission()} is set. The outcome is reported in the background: the returned future is
   * completed once it is queued, on the thread that completed the call's future (the executor
   * thread that ran {@code call} when it returned a completed one, or for a refusal), never on the
   * client's network threads, so its dependent stages may block.
   */
  public <T> CompletableFuture<T> guardAsync(
      String key, GuardOptions opts, Supplier<? extends CompletableFuture<T>> call) {
    Objects.requireNonNull(key, "key");
    Objects.requireNonNull(opts, "opts");
    CompletableFuture<T> result = new CompletableFuture<>();
    try {
      blockedLocally(key);
    } catch (BlockedException e) {
      result.completeExceptionally(e);
      return result;
    }
    CompletableFuture<AcquireResponse> acq = startAcquire(key, opts, null);
    result.whenComplete(
        (v, e) -> {
          if (result.isCancelled()) {
            acq.cancel(true);
          }
        });
    acq.whenComplete(
        (resp, err) -> {
          if (result.isCancelled()) {
            if (err == null) { // an admission nobody uses any more
              try {
                decide(key, opts, resp, null).complete(Outcome.IGNORED);
              } catch (FuseboxException ignored) {
                // refused anyway
              }
            }
            return;
          }
          Ticket t;
          try {
            t = decide(key, opts, resp, err);
          } catch (FuseboxException e) {
            result.completeExceptionally(e);
            return;
          }
          CompletableFuture<T> inner;
          Admission outer = CURRENT.get();
          CURRENT.set(t.admission());
          try {
            inner = call.get();
            if (inner == null) {
              throw new NullPointerException("the guarded call returned no future");
            }
          } catch (Throwable e) {
            t.complete(t.outcomeOf(e));
            result.completeExceptionally(e);
            return;
          } finally {
            CURRENT.set(outer);
          }
          result.whenComplete(
              (v, e) -> {
                if (result.isCancelled()) {
                  t.complete(Outcome.IGNORED);
                  inner.cancel(true);
                }
              });
          inner.whenComplete(
              (v, e) -> {
                if (e == null) {
                  t.succeeded(v);
                  result.complete(v);
                  return;
                }
                Throwable cause = unwrap(e);
                Outcome o = result.isCancelled() ? Outcome.IGNORED : t.outcomeOf(cause);
                t.complete(o);
                result.completeExceptionally(cause);
              });
        });
    return result;
  }

  private static Throwable unwrap(Throwable e) {
    while ((e instanceof java.util.concurrent.CompletionException || e instanceof ExecutionException)
        && e.getCause() != null) {
      e = e.getCause();
    }
    return e;
  }

  private void blockedLocally(String key) {
    long left = cache.blockedFor(key, ticker.getAsLong());
    if (left > 0) {
      counters.blockedLocal.increment();
      throw new BlockedException(key, "open", java.time.Duration.ofNanos(left), true);
    }
  }

  private long deadlineOf(GuardOptions opts) {
    return opts.deadline != null ? opts.deadline.toNanos() : deadlineNanos;
  }

  /**
   * A unary Acquire on the calling thread, as the generated blocking stub makes it (the answer is
   * handled on this thread, with no future in between): the one round trip of a guard.
   */
  private Ticket acquireUnary(String key, GuardOptions opts) {
    if (backoff.backingOff(ticker.getAsLong())) {
      return decide(key, opts, null, new BackingOffException());
    }
    long deadline = deadlineOf(opts) + opts.maxWait.toNanos();
    AcquireResponse resp = null;
    Throwable err = null;
    try {
      resp =
          ClientCalls.blockingUnaryCall(
              channel,
              FuseboxGrpc.getAcquireMethod(),
              CallOptions.DEFAULT.withDeadlineAfter(deadline, TimeUnit.NANOSECONDS),
              acquireRequest(key, opts));
    } catch (StatusRuntimeException e) {
      // An interrupted wait cancels the call (CANCELLED) and keeps the interrupt.
      if (e.getStatus().getCode() == Status.Code.CANCELLED && Thread.currentThread().isInterrupted()) {
        throw new CancellationException("interrupted while asking fusebox");
      }
      err = e;
    }
    return decide(key, opts, resp, err);
  }

  private CompletableFuture<AcquireResponse> startAcquire(String key, GuardOptions opts, java.util.concurrent.Executor executor) {
    if (backoff.backingOff(ticker.getAsLong())) {
      return CompletableFuture.failedFuture(new BackingOffException());
    }
    long deadline = deadlineOf(opts) + opts.maxWait.toNanos();
    return callAcquire(acquireRequest(key, opts), deadline, executor);
  }

  private AcquireRequest acquireRequest(String key, GuardOptions opts) {
    AcquireRequest.Builder req = AcquireRequest.newBuilder().setKey(key);
    if (opts.permits != null) {
      req.setPermits(opts.permits);
    }
    if (!opts.maxWait.isZero()) {
      req.setMaxWait(duration(opts.maxWait));
    }
    if (opts.lease != null) {
      req.setLease(duration(opts.lease));
    }
    String who = opts.caller != null ? opts.caller : caller;
    if (who != null && !who.isEmpty()) {
      req.setCaller(who);
    }
    if (opts.attempt != null) {
      req.setAttempt(opts.attempt);
    }
    return req.build();
  }

  /** Acquire, unary or as a frame of the Decide stream, within {@code deadlineNanos}. */
  CompletableFuture<AcquireResponse> callAcquire(
      AcquireRequest req, long deadlineNanos, java.util.concurrent.Executor executor) {
    if (stream != null) {
      return stream.acquire(req, deadlineNanos, executor);
    }
    return Rpc.call(channel, FuseboxGrpc.getAcquireMethod(), req, deadlineNanos, executor);
  }

  /**
   * One send of the outcome queue: the Completes as one CompleteBatch, or as complete frames of
   * the Decide stream in one message, within {@code deadlineNanos}. Per request, null when it was
   * answered, else why it was not; the future fails when the send failed as a whole. Completed on
   * a network or timer thread: its dependent stages must not block.
   */
  CompletableFuture<List<OutcomeQueue.Failed>> callCompleteAll(List<CompleteRequest> reqs, long deadlineNanos) {
    if (stream != null) {
      return stream.completeAll(reqs, deadlineNanos);
    }
    CompleteBatchRequest req = CompleteBatchRequest.newBuilder().addAllItems(reqs).build();
    return Rpc.call(channel, FuseboxGrpc.getCompleteBatchMethod(), req, deadlineNanos, Rpc.DIRECT)
        .thenApply(resp -> itemErrors(resp, reqs.size()));
  }

  private static List<OutcomeQueue.Failed> itemErrors(CompleteBatchResponse resp, int sent) {
    List<OutcomeQueue.Failed> out = new ArrayList<>(sent);
    for (int i = 0; i < sent; i++) {
      if (i >= resp.getResultsCount()) {
        out.add(
            new OutcomeQueue.Failed(
                Status.INTERNAL.withDescription(
                    "fusebox answered " + resp.getResultsCount() + " of " + sent + " items of a CompleteBatch"),
                false));
        continue;
      }
      CompleteResult r = resp.getResults(i);
      out.add(r.hasError() ? new OutcomeQueue.Failed(DecideStream.statusOf(r.getError()), true) : null);
    }
    return out;
  }

  /** Renew, unary or as a frame of the Decide stream, within {@code deadlineNanos}. */
  CompletableFuture<RenewResponse> callRenew(
      RenewRequest req, long deadlineNanos, java.util.concurrent.Executor executor) {
    if (stream != null) {
      return stream.renew(req, deadlineNanos, executor);
    }
    return Rpc.call(channel, FuseboxGrpc.getRenewMethod(), req, deadlineNanos, executor);
  }

  /** Turns fusebox's answer (or error) into a ticket, or throws the refusal. */
  private Ticket decide(String key, GuardOptions opts, AcquireResponse resp, Throwable err) {
    long deadline = deadlineOf(opts);
    if (err != null) {
      Status.Code code = Status.fromThrowable(err).getCode();
      if (!isUnavailable(code)) {
        backoff.answered();
        counters.requestErrors.increment();
        throw new FuseboxRequestException(key, err);
      }
      counters.unavailable.increment();
      if (!(err instanceof BackingOffException)) {
        backoff.outage(ticker.getAsLong());
        reconnector.trouble();
      }
      FailPolicy p = opts.onUnavailable != null ? opts.onUnavailable : failPolicy;
      if (p == FailPolicy.CLOSED) {
        counters.failedClosed.increment();
        logs.warn("unavailable", "fusebox unavailable (" + code + "); failing closed for \"" + key + "\"");
        throw new UnavailableException(key, err);
      }
      counters.failedOpen.increment();
      logs.warn("unavailable", "fusebox unavailable (" + code + "); failing open for \"" + key + "\"");
      return new Ticket(this, new Admission(key, null, false, true, err), opts, deadline, 0);
    }
    backoff.answered();
    switch (resp.getDecision()) {
      case DECISION_GRANTED:
      case DECISION_PROBE:
        {
          boolean probe = resp.getDecision() == dev.fusebox.v1.Decision.DECISION_PROBE;
          counters.granted.increment();
          if (probe) {
            counters.probes.increment();
          }
          cache.forget(key);
          String ticket = resp.getTicket().isEmpty() ? null : resp.getTicket();
          long lease = resp.hasLease() ? nanos(resp.getLease()) : 0;
          String shadowDecision = null;
          String shadowReason = null;
          if (resp.getShadowDecision() != dev.fusebox.v1.Decision.DECISION_UNSPECIFIED) {
            shadowDecision = decisionOf(resp.getShadowDecision());
            shadowReason = reasonOf(resp.getShadowReason());
          }
          Admission admission = new Admission(key, ticket, probe, false, null, shadowDecision, shadowReason);
          return new Ticket(this, admission, opts, deadline, lease);
        }
      case DECISION_BLOCKED:
        {
          counters.blocked.increment();
          java.time.Duration retry = retryAfter(resp);
          if (resp.getReason() == Reason.REASON_OPEN && retry != null) {
            long now = ticker.getAsLong();
            cache.put(key, now + retry.toNanos(), now);
          }
          throw new BlockedException(key, reasonOf(resp.getReason()), retry, false);
        }
      case DECISION_REFUSED:
        counters.refused.increment();
        throw new RefusedException(key);
      case DECISION_DENIED:
        counters.denied.increment();
        throw new DeniedException(key, reasonOf(resp.getReason()), retryAfter(resp));
      default:
        counters.requestErrors.increment();
        throw new FuseboxRequestException(
            key,
            Status.UNKNOWN.withDescription("unknown decision " + resp.getDecision()).asRuntimeException());
    }
  }

  private static java.time.Duration retryAfter(AcquireResponse resp) {
    if (!resp.hasRetryAfter()) {
      return null;
    }
    long n = nanos(resp.getRetryAfter());
    return n > 0 ? java.time.Duration.ofNanos(n) : null;
  }

  /** Codes that mean "fusebox is slow or down": the fail policy applies. */
  private static boolean isUnavailable(Status.Code code) {
    switch (code) {
      case UNAVAILABLE:
      case DEADLINE_EXCEEDED:
      case CANCELLED:
      case ABORTED:
      case INTERNAL:
      case UNKNOWN:
      case RESOURCE_EXHAUSTED: // fusebox at one of its caps cannot serve
        return true;
      default:
        return false;
    }
  }

  static String reasonOf(Reason r) {
    return r.name().substring("REASON_".length()).toLowerCase(Locale.ROOT);
  }

  /** A decision in lower case without its prefix ({@code blocked}, {@code denied}). */
  static String decisionOf(dev.fusebox.v1.Decision d) {
    String name = d.name();
    return (name.startsWith("DECISION_") ? name.substring("DECISION_".length()) : name).toLowerCase(Locale.ROOT);
  }

  static Duration duration(java.time.Duration d) {
    return Duration.newBuilder().setSeconds(d.getSeconds()).setNanos(d.getNano()).build();
  }

  static long nanos(Duration d) {
    return TimeUnit.SECONDS.toNanos(d.getSeconds()) + d.getNanos();
  }

  /** The outage a guard answers with, without asking fusebox, while backing off. */
  static final class BackingOffException extends io.grpc.StatusRuntimeException {
    private static final long serialVersionUID = 1L;

    BackingOffException() {
      super(Status.UNAVAILABLE.withDescription("fusebox was unavailable; backing off before asking again"));
    }
  }

  /**
   * After an outage the client's guards do not ask fusebox for a while: 100 ms, doubling to 5 s,
   * reset by the next answer. A window starts only when none is running, so a burst of failures
   * in one blip counts as one step.
   */
  static final class OutageBackoff {
    static final long FIRST = TimeUnit.MILLISECONDS.toNanos(100);
    static final long MAX = TimeUnit.SECONDS.toNanos(5);

    private boolean backingOff;
    private long until;
    private long next = FIRST;

    synchronized boolean backingOff(long now) {
      return backingOff && now - until < 0;
    }

    synchronized void outage(long now) {
      if (!backingOff || now - until >= 0) {
        backingOff = true;
        until = now + next;
        next = Math.min(next * 2, MAX);
      }
    }

    synchronized void answered() {
      backingOff = false;
      next = FIRST;
    }

    synchronized long next() {
      return next;
    }
  }

  /** The client's counters. */
  static final class Counters {
    final LongAdder granted = new LongAdder();
    final LongAdder probes = new LongAdder();
    final LongAdder blocked = new LongAdder();
    final LongAdder blockedLocal = new LongAdder();
    final LongAdder refused = new LongAdder();
    final LongAdder denied = new LongAdder();
    final LongAdder unavailable = new LongAdder();
    final LongAdder failedOpen = new LongAdder();
    final LongAdder failedClosed = new LongAdder();
    final LongAdder requestErrors = new LongAdder();
    final LongAdder renewals = new LongAdder();
    final LongAdder renewErrors = new LongAdder();
    final LongAdder completed = new LongAdder();
    final LongAdder completeFailures = new LongAdder();
    final LongAdder outcomesDropped = new LongAdder();

    Stats snapshot() {
      return new Stats(
          granted.sum(),
          probes.sum(),
          blocked.sum(),
          blockedLocal.sum(),
          refused.sum(),
          denied.sum(),
          unavailable.sum(),
          failedOpen.sum(),
          failedClosed.sum(),
          requestErrors.sum(),
          renewals.sum(),
          renewErrors.sum(),
          completed.sum(),
          completeFailures.sum(),
          outcomesDropped.sum(),
          completeFailures.sum());
    }
  }

  /**
   * Reconnection with a backoff of 100 ms growing to 5 s. grpc-java's own reconnect backoff (1 s
   * growing to 2 min) cannot be configured, so while the channel is in TRANSIENT_FAILURE this
   * cuts it short ({@link ManagedChannel#resetConnectBackoff()}) on its own schedule; the delay
   * starts again at 100 ms once the channel is READY.
   */
  static final class Reconnector {
    static final long FIRST = TimeUnit.MILLISECONDS.toNanos(100);
    static final long MAX = TimeUnit.SECONDS.toNanos(5);

    private final ManagedChannel channel;
    private long delay = FIRST;
    private boolean pending;

    Reconnector(ManagedChannel channel) {
      this.channel = channel;
    }

    void start() {
      watch(channel.getState(true));
    }

    private void watch(ConnectivityState state) {
      if (state == ConnectivityState.SHUTDOWN) {
        return;
      }
      if (state == ConnectivityState.READY) {
        synchronized (this) {
          delay = FIRST;
        }
      } else if (state == ConnectivityState.TRANSIENT_FAILURE) {
        trouble();
      }
      channel.notifyWhenStateChanged(state, () -> watch(channel.getState(false)));
    }

    /** Schedules the next reconnection attempt, unless one is scheduled. */
    void trouble() {
      long d;
      synchronized (this) {
        if (pending) {
          return;
        }
        pending = true;
        d = delay;
        delay = Math.min((long) (delay * 1.6), MAX);
      }
      Rpc.SCHEDULER.schedule(
          () -> {
            synchronized (this) {
              pending = false;
            }
            if (channel.getState(false) == ConnectivityState.TRANSIENT_FAILURE) {
              channel.resetConnectBackoff();
            }
          },
          d,
          TimeUnit.NANOSECONDS);
    }
  }

  /** Builds a {@link FuseboxClient}. */
  public static final class Builder {
    private final String target;
    private ChannelCredentials credentials = InsecureChannelCredentials.create();
    private String authority;
    private String token;
    private java.time.Duration deadline = DEFAULT_DEADLINE;
    private FailPolicy failPolicy = FailPolicy.OPEN;
    private int cacheSize = DEFAULT_CACHE_SIZE;
    private java.time.Duration logInterval = DEFAULT_LOG_INTERVAL;
    private Logger logger = LOG;
    private LongSupplier ticker = System::nanoTime;
    private io.grpc.ClientInterceptor interceptor;
    private Transport transport = Transport.UNARY;
    private int outcomeQueue = DEFAULT_OUTCOME_QUEUE;
    private String caller;

    private Builder(String target) {
      this.target = Objects.requireNonNull(target, "target");
    }

    /** Sends {@code authorization: Bearer TOKEN} on every call (null or empty: none). */
    public Builder token(String token) {
      this.token = token == null || token.isEmpty() ? null : token;
      return this;
    }

    /**
     * Names who this client calls for (a service's name, at most 128 bytes of printable UTF-8),
     * sent as every Acquire's {@code caller} (rule Q1) unless a guard says otherwise ({@link
     * GuardOptions#caller(String)}); null or empty: none, and fusebox takes the connection's
     * address. With a token fusebox takes the token's name instead. fusebox refuses a longer one
     * with INVALID_ARGUMENT naming {@code caller} (a {@link FuseboxRequestException}).
     */
    public Builder caller(String name) {
      this.caller = name == null || name.isEmpty() ? null : name;
      return this;
    }

    /** Connects with these credentials (such as {@link TlsChannelCredentials}); default plaintext. */
    public Builder tls(ChannelCredentials credentials) {
      this.credentials = Objects.requireNonNull(credentials);
      return this;
    }

    /**
     * Connects with TLS: {@code caFile} (PEM) is the roots to trust (null: the system's), {@code
     * certFile} and {@code keyFile} a client certificate for mutual TLS (null: none), {@code
     * serverName} overrides the name checked in the server's certificate (null: the target's host).
     *
     * @throws UncheckedIOException a file cannot be read
     */
    public Builder tlsFromFiles(String caFile, String certFile, String keyFile, String serverName) {
      TlsChannelCredentials.Builder b = TlsChannelCredentials.newBuilder();
      try {
        if (caFile != null && !caFile.isEmpty()) {
          b.trustManager(new File(caFile));
        }
        if (certFile != null && !certFile.isEmpty()) {
          b.keyManager(new File(certFile), new File(keyFile));
        }
      } catch (IOException e) {
        throw new UncheckedIOException("fusebox: reading TLS files", e);
      }
      this.credentials = b.build();
      this.authority = serverName == null || serverName.isEmpty() ? null : serverName;
      return this;
    }

    /**
     * Bounds each call to fusebox itself (default 50 ms; plus max-wait for Acquire). A report of
     * outcomes in the background, and {@link FuseboxClient#close()}'s flush, get at least 1 s.
     */
    public Builder deadline(java.time.Duration d) {
      if (d.isNegative() || d.isZero()) {
        throw new IllegalArgumentException("deadline must be positive");
      }
      this.deadline = d;
      return this;
    }

    /**
     * How Acquire, Complete and Renew reach fusebox (default {@link Transport#UNARY}, one call
     * each); {@link Transport#STREAM} sends them as frames of one {@code Decide} stream per client.
     */
    public Builder transport(Transport t) {
      this.transport = Objects.requireNonNull(t);
      return this;
    }

    /**
     * Bounds the outcome queue (default 10,000): the outcomes of ended calls waiting to be reported
     * while a report is in flight. With the queue full an outcome is dropped and counted ({@link
     * Stats#outcomesDropped()}), and its ticket's lease ends on the server.
     *
     * @throws IllegalArgumentException {@code n} is less than 1
     */
    public Builder outcomeQueue(int n) {
      if (n < 1) {
        throw new IllegalArgumentException("outcomeQueue must be at least 1 (outcomes waiting to be reported), not " + n);
      }
      this.outcomeQueue = n;
      return this;
    }

    /** What guards do when fusebox cannot be asked in time (default {@link FailPolicy#OPEN}). */
    public Builder failPolicy(FailPolicy p) {
      this.failPolicy = Objects.requireNonNull(p);
      return this;
    }

    /** Bounds the local short-circuit cache (default 1024); 0 turns it off. */
    public Builder cacheSize(int n) {
      this.cacheSize = n;
      return this;
    }

    /** The least time between two log lines about the same kind of trouble (default 10 s). */
    public Builder logInterval(java.time.Duration d) {
      this.logInterval = Objects.requireNonNull(d);
      return this;
    }

    /** Where trouble is logged (default the SLF4J logger {@code dev.fusebox.client}). */
    public Builder logger(Logger l) {
      this.logger = Objects.requireNonNull(l);
      return this;
    }

    /** Replaces {@link System#nanoTime()} for the local short-circuit cache and the outage backoff (tests). */
    Builder ticker(LongSupplier t) {
      this.ticker = t;
      return this;
    }

    /** Adds an interceptor to the client's channel (tests). */
    Builder interceptor(io.grpc.ClientInterceptor i) {
      this.interceptor = i;
      return this;
    }

    /** Makes the client. The connection is made in the background; it does not wait for it. */
    public FuseboxClient build() {
      return new FuseboxClient(this);
    }

    /**
     * The process's client for this target: made with this builder on first use; later calls for
     * the same target get the same client and ignore their builder.
     */
    public FuseboxClient shared() {
      return SHARED.computeIfAbsent(target, t -> build());
    }
  }
}
