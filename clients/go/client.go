// Package fusebox is a Go client for the fusebox circuit-breaker and
// permit-book service.
//
// Make one Client per process (or use Shared) and wrap each call to a
// dependency in Guard:
//
//	err := c.Guard(ctx, "payments/charge", func(ctx context.Context) error {
//		return charge(ctx, order)
//	})
//	var blocked *fusebox.BlockedError
//	if errors.As(err, &blocked) { retryLater(blocked.RetryAfter) }
//
// A guard pays one round trip to fusebox, its Acquire: the call's outcome
// is reported in the background (see Flush), and Close reports what is
// still queued before it closes.
package fusebox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/fusebox/fusebox/clients/go/fuseboxpb"
)

// DefaultDeadline is how long a guard waits for fusebox itself (Acquire,
// Complete, Renew) before treating it as unavailable.
const DefaultDeadline = 50 * time.Millisecond

// DefaultCacheSize bounds the local short-circuit cache (keys known OPEN).
const DefaultCacheSize = 1024

// DefaultLogInterval is the least time between two log lines about the
// same kind of trouble (fusebox unavailable, a failed Complete or Renew).
const DefaultLogInterval = 10 * time.Second

// Client talks to one fusebox server over one shared *grpc.ClientConn.
// It is safe for concurrent use.
type Client struct {
	conn     *grpc.ClientConn
	ownsConn bool
	fusebox  pb.FuseboxClient
	admin    pb.AdminClient

	defaults guardConfig
	now      func() time.Time
	cache    *openCache
	logs     *logLimiter
	stats    counters
	backoff  outageBackoff
	mux      *mux // the Decide stream, with TransportStream; nil otherwise
	outcomes *outcomeQueue
	closing  sync.Once
	closeErr error
}

// Outage backoff: after fusebox was unavailable, guards do not ask it
// again for a while (100 ms, doubling to 5 s, reset by the next answer).
const (
	initialBackoff = 100 * time.Millisecond
	maxBackoff     = 5 * time.Second
)

type outageBackoff struct {
	mu    sync.Mutex
	until time.Time // zero: not backing off
	next  time.Duration
}

// backingOff reports whether guards answer without asking fusebox.
func (b *outageBackoff) backingOff(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return now.Before(b.until)
}

// outage starts a backoff window unless one is running, so that a burst
// of failures in one outage counts as one step.
func (b *outageBackoff) outage(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.until.After(now) {
		return
	}
	if b.next == 0 {
		b.next = initialBackoff
	}
	b.until = now.Add(b.next)
	b.next = min(b.next*2, maxBackoff)
}

// answered resets the backoff: fusebox answers again.
func (b *outageBackoff) answered() {
	b.mu.Lock()
	b.until = time.Time{}
	b.next = initialBackoff
	b.mu.Unlock()
}

type clientConfig struct {
	token       string
	tlsConfig   *tls.Config
	conn        *grpc.ClientConn
	dialOptions []grpc.DialOption
	defaults    []GuardOption
	logger      *slog.Logger
	logInterval time.Duration
	cacheSize   int
	now         func() time.Time
	transport   Transport
	queue       int
	caller      string
}

// Option configures a Client.
type Option func(*clientConfig)

// WithToken sends `authorization: Bearer TOKEN` on every call.
func WithToken(token string) Option { return func(c *clientConfig) { c.token = token } }

// WithTLS connects with TLS using this configuration (nil means the
// system roots). Without it the connection is plaintext.
func WithTLS(cfg *tls.Config) Option {
	return func(c *clientConfig) {
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		c.tlsConfig = cfg
	}
}

// WithConn uses an existing connection instead of dialing; Close then
// leaves it open.
func WithConn(conn *grpc.ClientConn) Option { return func(c *clientConfig) { c.conn = conn } }

// WithDialOptions adds grpc dial options (interceptors, keepalive, ...).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *clientConfig) { c.dialOptions = append(c.dialOptions, opts...) }
}

// WithGuardDefaults sets options applied to every Guard before its own.
func WithGuardDefaults(opts ...GuardOption) Option {
	return func(c *clientConfig) { c.defaults = append(c.defaults, opts...) }
}

// WithCaller names who this client calls for (a service's name), sent as
// every Acquire's caller (rule Q1) unless a guard says otherwise (Caller).
// Without it fusebox takes the connection's address; with a token, the
// token's name. A breaker with a quorum counts failures by caller. At most
// 128 bytes of printable UTF-8: fusebox refuses another with
// INVALID_ARGUMENT naming caller (a *RequestError).
func WithCaller(name string) Option { return func(c *clientConfig) { c.caller = name } }

// WithLogger sets where trouble is logged (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *clientConfig) { c.logger = l } }

// WithLogInterval sets the least time between two log lines about the
// same kind of trouble (default DefaultLogInterval).
func WithLogInterval(d time.Duration) Option { return func(c *clientConfig) { c.logInterval = d } }

// WithCacheSize bounds the local short-circuit cache; 0 disables it.
func WithCacheSize(n int) Option { return func(c *clientConfig) { c.cacheSize = n } }

// WithClock replaces time.Now for the local short-circuit cache and the
// outage backoff (tests against a server with a manual clock move both
// together).
func WithClock(now func() time.Time) Option { return func(c *clientConfig) { c.now = now } }

// WithTransport sets how the client's Acquire, Complete and Renew reach
// fusebox: TransportUnary (the default), one unary call each, or
// TransportStream, frames of one Decide stream per client.
func WithTransport(t Transport) Option { return func(c *clientConfig) { c.transport = t } }

// WithOutcomeQueue bounds how many outcomes of guarded calls may wait to be
// reported to fusebox (default DefaultOutcomeQueue, at least 1). While
// fusebox is slow or unreachable the queue fills; an outcome past the
// bound is dropped and counted in Stats.OutcomesDropped, and its ticket's
// lease ends on the server.
func WithOutcomeQueue(n int) Option { return func(c *clientConfig) { c.queue = n } }

// TLSFromFiles builds a TLS configuration: caFile (PEM) is the roots to
// trust (empty: the system's), certFile and keyFile a client certificate
// for mutual TLS (both empty: none), serverName overrides the name checked
// in the server's certificate.
func TLSFromFiles(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("fusebox: reading CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("fusebox: no certificate in %s", caFile)
		}
		cfg.RootCAs = pool
	}
	if certFile != "" || keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("fusebox: reading client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// New makes a client for the server at target (host:port, or any grpc-go
// target). The connection is made lazily and re-made with backoff after a
// failure; New does not wait for the server.
func New(target string, opts ...Option) (*Client, error) {
	cfg := clientConfig{logInterval: DefaultLogInterval, cacheSize: DefaultCacheSize, queue: DefaultOutcomeQueue}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.queue < 1 {
		return nil, fmt.Errorf("fusebox: WithOutcomeQueue(%d): the outcome queue must hold at least 1 outcome; leave the option out for the default of %d", cfg.queue, DefaultOutcomeQueue)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	c := &Client{now: cfg.now, logs: newLogLimiter(cfg.logger, cfg.logInterval)}
	c.defaults = defaultGuardConfig()
	c.defaults.caller = cfg.caller
	for _, o := range cfg.defaults {
		o(&c.defaults)
	}
	if cfg.cacheSize > 0 {
		c.cache = newOpenCache(cfg.cacheSize)
	}
	conn := cfg.conn
	if conn == nil {
		dial := []grpc.DialOption{
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff: backoff.Config{
					BaseDelay:  100 * time.Millisecond,
					Multiplier: 1.6,
					Jitter:     0.2,
					MaxDelay:   5 * time.Second,
				},
				MinConnectTimeout: time.Second,
			}),
		}
		if cfg.tlsConfig != nil {
			dial = append(dial, grpc.WithTransportCredentials(credentials.NewTLS(cfg.tlsConfig)))
		} else {
			dial = append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}
		if cfg.token != "" {
			dial = append(dial, grpc.WithPerRPCCredentials(bearer{token: cfg.token, secure: cfg.tlsConfig != nil}))
		}
		dial = append(dial, cfg.dialOptions...)
		var err error
		conn, err = grpc.NewClient(target, dial...)
		if err != nil {
			return nil, fmt.Errorf("fusebox: %w", err)
		}
		c.ownsConn = true
	}
	c.conn = conn
	c.fusebox = pb.NewFuseboxClient(conn)
	c.admin = pb.NewAdminClient(conn)
	if cfg.transport == TransportStream {
		c.mux = newMux(c.fusebox, c.abandoned)
	}
	c.outcomes = newOutcomeQueue(cfg.queue, c.defaults.deadline, c.sendOutcomes, c.lostAtClose)
	return c, nil
}

var (
	sharedMu      sync.Mutex
	sharedClients = map[string]*Client{}
)

// Shared returns the process's client for target, making it with opts on
// first use; later calls for the same target get the same client (and the
// same connection) and ignore their opts.
func Shared(target string, opts ...Option) (*Client, error) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if c, ok := sharedClients[target]; ok {
		return c, nil
	}
	c, err := New(target, opts...)
	if err != nil {
		return nil, err
	}
	sharedClients[target] = c
	return c, nil
}

// Close first reports the outcomes still queued (Flush) within the
// client's deadline, at least 1 s; those it could not report in that time
// are counted in Stats.CompleteFailures. Then it ends the client's Decide
// stream, if any, and closes the connection (unless it was given with
// WithConn). Outcomes of guards that end after Close are not reported.
// Later calls of Close do nothing and return the first one's error.
func (c *Client) Close() error {
	sharedMu.Lock()
	for t, s := range sharedClients {
		if s == c {
			delete(sharedClients, t)
		}
	}
	sharedMu.Unlock()
	c.closing.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.outcomes.deadline)
		_ = c.outcomes.flush(ctx) // what is left is counted by close
		cancel()
		c.outcomes.close()
		if c.mux != nil {
			c.mux.close()
		}
		if c.ownsConn {
			c.closeErr = c.conn.Close()
		}
	})
	return c.closeErr
}

// Conn is the client's connection, for the generated Admin and Clock stubs.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Admin is the operator API on the client's connection.
func (c *Client) Admin() pb.AdminClient { return c.admin }

// Stats is a snapshot of the client's counters.
func (c *Client) Stats() Stats { return c.stats.snapshot() }

type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false so that a token also goes over a
// plaintext connection to a server on loopback; use WithTLS elsewhere.
func (b bearer) RequireTransportSecurity() bool { return false }

// acquire is the Acquire call, unary or as a frame of the Decide stream.
func (c *Client) acquire(ctx context.Context, req *pb.AcquireRequest) (*pb.AcquireResponse, error) {
	if c.mux == nil {
		return c.fusebox.Acquire(ctx, req)
	}
	r, err := c.mux.call(ctx, &pb.DecideFrame{Request: &pb.DecideFrame_Acquire{Acquire: req}})
	if err != nil {
		return nil, err
	}
	if resp := r.GetAcquire(); resp != nil {
		return resp, nil
	}
	return nil, unexpected(r)
}

// renew is the Renew call, unary or as a frame of the Decide stream.
func (c *Client) renew(ctx context.Context, req *pb.RenewRequest) (*pb.RenewResponse, error) {
	if c.mux == nil {
		return c.fusebox.Renew(ctx, req)
	}
	r, err := c.mux.call(ctx, &pb.DecideFrame{Request: &pb.DecideFrame_Renew{Renew: req}})
	if err != nil {
		return nil, err
	}
	if resp := r.GetRenew(); resp != nil {
		return resp, nil
	}
	return nil, unexpected(r)
}
