package fusebox

// Outcomes off the caller's path (../README.md, "Outcomes off the caller's
// path"): a guard puts its call's outcome into the client's outcome queue
// and returns; one sender per client reports what is queued, one send at a
// time, the outcomes that ended during a send going together in the next
// (up to outcomesPerSend). The caller never waits on the network for its
// outcome.

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "github.com/fusebox/fusebox/clients/go/fuseboxpb"
)

// DefaultOutcomeQueue is how many outcomes may wait to be reported to
// fusebox; past it an outcome is dropped (Stats.OutcomesDropped) and its
// ticket's lease ends on the server.
const DefaultOutcomeQueue = 10_000

const (
	// outcomesPerSend is the most outcomes reported in one send (the
	// server's limit per message).
	outcomesPerSend = 1_000
	// minSendDeadline is the least deadline of a send, and of the flush
	// that Close makes: nobody waits on them, so a short guard deadline
	// must not make them give up early.
	minSendDeadline = time.Second
)

var (
	errQueueFull   = errors.New("fusebox: the outcome queue is full")
	errQueueClosed = errors.New("fusebox: the client is closed")
)

// pendingOutcome is one call's outcome waiting to be reported.
type pendingOutcome struct {
	key     string
	ticket  string
	outcome Outcome
	cost    *uint32 // the permits really used (WithCost); nil: the ticket's
}

// outcomeQueue holds outcomes until its sender reports them. Outcomes are
// numbered in the order they were queued and sent in that order, so
// "every outcome queued before a flush has been answered" is one
// comparison of two counts.
type outcomeQueue struct {
	limit    int
	deadline time.Duration
	// send reports one batch (1 to outcomesPerSend outcomes) within ctx and
	// counts what it could not report; it is only called by the sender.
	send func(ctx context.Context, batch []pendingOutcome)
	// lost counts the outcomes still queued when the client closed.
	lost func(batch []pendingOutcome)

	mu       sync.Mutex
	waiting  []pendingOutcome
	idle     bool   // the sender waits for wake
	queued   uint64 // outcomes ever queued
	settled  uint64 // of which the send has ended (answered or failed)
	progress chan struct{}
	closed   bool

	wake   chan struct{}
	ctx    context.Context // cancelled by close: ends the send in flight
	cancel context.CancelFunc
	done   chan struct{} // closed when the sender has returned
}

// newOutcomeQueue starts the queue's sender: one goroutine for the life
// of the client, whatever the number of outcomes.
func newOutcomeQueue(limit int, deadline time.Duration, send func(context.Context, []pendingOutcome), lost func([]pendingOutcome)) *outcomeQueue {
	ctx, cancel := context.WithCancel(context.Background())
	q := &outcomeQueue{
		limit:    limit,
		deadline: max(deadline, minSendDeadline),
		send:     send,
		lost:     lost,
		wake:     make(chan struct{}, 1),
		ctx:      ctx,
		cancel:   cancel,
		done:     make(chan struct{}),
	}
	go q.run()
	return q
}

// put queues o without waiting: errQueueFull when the queue holds its
// limit already, errQueueClosed once the client is closed.
func (q *outcomeQueue) put(o pendingOutcome) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return errQueueClosed
	}
	if len(q.waiting) >= q.limit {
		q.mu.Unlock()
		return errQueueFull
	}
	q.waiting = append(q.waiting, o)
	q.queued++
	wake := q.idle
	q.idle = false
	q.mu.Unlock()
	if wake {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

// run is the sender: it sends what is queued, one send at a time, until
// the queue is closed.
func (q *outcomeQueue) run() {
	defer close(q.done)
	var batch []pendingOutcome // reused from send to send
	for {
		q.mu.Lock()
		for len(q.waiting) == 0 && !q.closed {
			q.idle = true
			q.mu.Unlock()
			select {
			case <-q.wake:
			case <-q.ctx.Done():
			}
			q.mu.Lock()
		}
		if q.closed {
			rest := q.waiting
			q.waiting = nil
			q.mu.Unlock()
			if len(rest) > 0 {
				q.lost(rest)
			}
			q.settle(len(rest))
			return
		}
		n := min(len(q.waiting), outcomesPerSend)
		batch = append(batch[:0], q.waiting[:n]...)
		left := copy(q.waiting, q.waiting[n:])
		clear(q.waiting[left:]) // let go of the keys and tickets sent
		q.waiting = q.waiting[:left]
		q.mu.Unlock()

		ctx, cancel := context.WithTimeout(q.ctx, q.deadline)
		q.send(ctx, batch)
		cancel()
		clear(batch)
		q.settle(n)
	}
}

// settle records that n more outcomes' sends have ended, and wakes the
// flushes waiting.
func (q *outcomeQueue) settle(n int) {
	q.mu.Lock()
	q.settled += uint64(n)
	if q.progress != nil {
		close(q.progress)
		q.progress = nil
	}
	q.mu.Unlock()
}

// flush waits until every outcome queued before it has been answered (or
// its send failed), or until ctx is done.
func (q *outcomeQueue) flush(ctx context.Context) error {
	q.mu.Lock()
	target := q.queued
	for q.settled < target {
		if q.progress == nil {
			q.progress = make(chan struct{})
		}
		progress := q.progress
		q.mu.Unlock()
		select {
		case <-progress:
		case <-ctx.Done():
			return ctx.Err()
		}
		q.mu.Lock()
	}
	q.mu.Unlock()
	return nil
}

// close stops the sender: the send in flight ends, the outcomes still
// queued are counted lost, and later outcomes are refused.
func (q *outcomeQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cancel()
	<-q.done
}

// report queues a finished call's outcome for the sender; the caller does
// not wait. A full queue drops it, a closed client cannot send it: both are
// counted and logged, and the ticket's lease then ends on the server.
func (c *Client) report(key, ticket string, outcome Outcome, cost *uint32) {
	switch c.outcomes.put(pendingOutcome{key: key, ticket: ticket, outcome: outcome, cost: cost}) {
	case errQueueFull:
		c.stats.outcomesDropped.Add(1)
		c.logs.warn("outcome-dropped", "fusebox: the outcome queue is full, so a call's outcome was dropped; "+
			"its ticket's lease will end on the server, which counts it as expired. "+
			"fusebox is slow or unreachable: check it, or raise WithOutcomeQueue if bursts are expected",
			"key", key, "outcome", outcome.String(), "queue", c.outcomes.limit)
	case errQueueClosed:
		c.stats.completeFailures.Add(1)
		c.logs.warn("complete", "fusebox: a call ended after its client was closed, so its outcome was not reported; "+
			"its ticket's lease will end on the server. Close the client only after its guards have returned",
			"key", key, "outcome", outcome.String())
	}
}

// Flush waits until every outcome queued before it has been reported to
// fusebox (or its send has failed, which Stats.CompleteFailures counts),
// or until ctx is done, whose error it then returns. Call it where the
// next call must see the last outcome, say a concurrency limit of one used
// by one process.
func (c *Client) Flush(ctx context.Context) error {
	return c.outcomes.flush(ctx)
}

// sendOutcomes is the sender's one send: a CompleteBatch, or with
// TransportStream the complete frames of the Decide stream in one message,
// whose answers it awaits.
func (c *Client) sendOutcomes(ctx context.Context, batch []pendingOutcome) {
	if c.mux != nil {
		c.sendOutcomeFrames(ctx, batch)
		return
	}
	items := make([]*pb.CompleteRequest, len(batch))
	for i, o := range batch {
		items[i] = o.request()
	}
	resp, err := c.fusebox.CompleteBatch(ctx, &pb.CompleteBatchRequest{Items: items})
	if err != nil {
		c.completeFailed(batch, err)
		return
	}
	results := resp.GetResults()
	for i, o := range batch {
		switch {
		case i >= len(results):
			c.completeFailed(batch[i:], errMissingAnswer)
			return
		case results[i].GetError() != nil:
			c.completeRefused(o, errorOf(results[i].GetError()))
		default:
			c.stats.completed.Add(1)
		}
	}
}

// request is the outcome as one CompleteRequest.
func (o pendingOutcome) request() *pb.CompleteRequest {
	return &pb.CompleteRequest{Ticket: o.ticket, Outcome: pb.Outcome(o.outcome), Cost: o.cost}
}

var errMissingAnswer = errors.New("fusebox: the answer had fewer results than the outcomes sent")

func (c *Client) sendOutcomeFrames(ctx context.Context, batch []pendingOutcome) {
	frames := make([]*pb.DecideFrame, len(batch))
	for i, o := range batch {
		frames[i] = &pb.DecideFrame{Request: &pb.DecideFrame_Complete{
			Complete: o.request(),
		}}
	}
	results, err := c.mux.callTogether(ctx, frames)
	var unanswered []pendingOutcome
	for i, o := range batch {
		var r *pb.DecideResult
		if results != nil {
			r = results[i]
		}
		switch {
		case r == nil:
			unanswered = append(unanswered, o)
		case r.GetError() != nil:
			c.completeRefused(o, errorOf(r.GetError()))
		case r.GetComplete() == nil:
			c.completeRefused(o, unexpected(r))
		default:
			c.stats.completed.Add(1)
		}
	}
	if len(unanswered) > 0 {
		if err == nil {
			err = errMissingAnswer
		}
		c.completeFailed(unanswered, err)
	}
}

// completeFailed counts and logs outcomes whose send failed.
func (c *Client) completeFailed(batch []pendingOutcome, err error) {
	c.stats.completeFailures.Add(uint64(len(batch)))
	c.logs.warn("complete", "fusebox: could not report calls' outcomes; their tickets' leases will end on the server, "+
		"which counts them as expired. Check that fusebox is up and reachable from this process",
		"outcomes", len(batch), "key", batch[0].key, "err", err)
}

// completeRefused counts and logs an outcome fusebox answered with an
// error (an unknown or already completed ticket).
func (c *Client) completeRefused(o pendingOutcome, err error) {
	c.stats.completeFailures.Add(1)
	c.logs.warn("complete", "fusebox: refused a call's outcome (its ticket is unknown, already completed, or its lease ended); "+
		"nothing to do unless this repeats, then check the lease (Lease option) against how long calls take",
		"key", o.key, "outcome", o.outcome.String(), "err", err)
}

// lostAtClose counts and logs the outcomes still queued when the client
// closed (its flush ran out of time).
func (c *Client) lostAtClose(batch []pendingOutcome) {
	c.completeFailed(batch, errQueueClosed)
}
