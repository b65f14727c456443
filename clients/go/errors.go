package fusebox

import (
	"fmt"
	"strings"
	"time"

	pb "github.com/fusebox/fusebox/clients/go/fuseboxpb"
)

// Reason says why a request was blocked or denied: "open",
// "probe_in_flight", "no_permits", "queue_full", "exceeds_limit",
// "evicted", "timeout", as the server names them in its statistics.
type Reason string

func reasonOf(r pb.Reason) Reason {
	return Reason(strings.ToLower(strings.TrimPrefix(r.String(), "REASON_")))
}

// Refusal is implemented by the three errors fusebox answers instead of
// running the call: *BlockedError, *RefusedError and *DeniedError. They
// never come from the call itself.
type Refusal interface {
	error
	refusal()
}

// BlockedError: the key's breaker is OPEN (or a probe is in flight); the
// call was not made. RetryAfter is zero when the server gave no hint.
// Local is true when the answer came from the local short-circuit cache
// without asking the server.
type BlockedError struct {
	Key        string
	Reason     Reason
	RetryAfter time.Duration
	Local      bool
}

func (e *BlockedError) Error() string { return refusalText(e.Key, "blocked", e.Reason, e.RetryAfter) }
func (*BlockedError) refusal()        {}

// refusalText is the message of a blocked or denied call: the key, what
// fusebox answered and why, and when to try again if the server said.
func refusalText(key, answer string, reason Reason, retryAfter time.Duration) string {
	s := fmt.Sprintf("fusebox: %q %s (%s)", key, answer, reason)
	if retryAfter > 0 {
		s += fmt.Sprintf(", retry after %v", retryAfter)
	}
	return s
}

// RefusedError: the key is isolated by an operator; the call was not made.
type RefusedError struct {
	Key string
}

func (e *RefusedError) Error() string { return fmt.Sprintf("fusebox: %q refused (isolated)", e.Key) }
func (*RefusedError) refusal()        {}

// DeniedError: the breaker admitted but the permit book did not; the call
// was not made. RetryAfter is zero when the server gave no hint.
type DeniedError struct {
	Key        string
	Reason     Reason
	RetryAfter time.Duration
}

func (e *DeniedError) Error() string { return refusalText(e.Key, "denied", e.Reason, e.RetryAfter) }
func (*DeniedError) refusal()        {}

// UnavailableError: fusebox could not be asked in time (down, slow, or
// unreachable) and the guard fails closed, so the call was not made. Err
// is the gRPC error.
type UnavailableError struct {
	Key string
	Err error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("fusebox: unavailable for %q: %v", e.Key, e.Err)
}
func (e *UnavailableError) Unwrap() error { return e.Err }

// RequestError: fusebox rejected the request itself (a bad key or
// duration, a missing or unknown token, a cap reached). It is not a
// decision about the dependency; the call was not made. Err is the gRPC
// status error.
type RequestError struct {
	Key string
	Err error
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("fusebox: request for %q rejected: %v", e.Key, e.Err)
}
func (e *RequestError) Unwrap() error { return e.Err }
