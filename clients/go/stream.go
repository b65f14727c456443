package fusebox

// The client's calls multiplexed over one Decide stream per client
// (TransportStream): each call is a frame with an id of its own, the frames
// ready together go out in one message, and each answer is handed to its
// caller by id. The stream is opened on the first call and again after it
// ends (the calls in flight on it fail UNAVAILABLE, as a broken unary call
// would). The outcome sender's complete frames go together in one message
// (callTogether); the late grant of an Acquire already given up is handed
// back (onAbandoned) so that its ticket is completed IGNORED.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fusebox/fusebox/clients/go/fuseboxpb"
)

// Transport is how a client's calls (Acquire, Complete, Renew) reach
// fusebox.
type Transport int

const (
	// TransportUnary makes one unary call per Acquire, Complete and Renew
	// (the default).
	TransportUnary Transport = iota
	// TransportStream sends every call as a frame of one Decide stream per
	// client, the frames ready together in one message: fewer messages for
	// a busy process. The stream is opened on the first call and again
	// after it ends.
	TransportStream
)

func (t Transport) String() string {
	if t == TransportStream {
		return "stream"
	}
	return "unary"
}

const (
	// streamQueue is how many parts (a frame, or the frames of one send of
	// outcomes) may wait for the stream at most (a caller past it waits).
	streamQueue = 10_000
	// framesPerMessage is the most frames sent in one message (the
	// server's limit).
	framesPerMessage = 1_000
)

// mux is one client's Decide stream, opened on demand.
type mux struct {
	fusebox pb.FuseboxClient
	nextID  atomic.Uint64
	// onAbandoned is given the key and ticket of a grant that came after
	// its Acquire was given up.
	onAbandoned func(key, ticket string)

	// framesSent counts the frames written to the client's streams (tests
	// read it to know a frame went out before the next).
	framesSent atomic.Uint64

	mu     sync.Mutex
	cur    *decideStream // nil until opened; replaced once ended
	closed bool
}

// decideStream is one open Decide stream.
type decideStream struct {
	// parts to send; the frames of one part go out in one message.
	parts       chan []*pb.DecideFrame
	done        chan struct{} // closed when the stream has ended
	cancel      context.CancelFunc
	onAbandoned func(key, ticket string)
	framesSent  *atomic.Uint64

	mu      sync.Mutex
	ended   bool
	pending map[uint64]chan *pb.DecideResult
	// abandoned holds the ids of Acquires given up, by key, until their
	// answer comes: CANCELLED, or a grant made before the cancel.
	abandoned map[uint64]string
}

func newMux(fusebox pb.FuseboxClient, onAbandoned func(key, ticket string)) *mux {
	return &mux{fusebox: fusebox, onAbandoned: onAbandoned}
}

// stream returns the open stream, opening one if need be within ctx.
func (m *mux) stream(ctx context.Context) (*decideStream, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, status.Error(codes.Unavailable, "fusebox: the client is closed")
	}
	if s := m.cur; s != nil {
		select {
		case <-s.done:
		default:
			return s, nil
		}
	}
	sctx, cancel := context.WithCancel(context.Background())
	// The stream outlives the call that opens it, but opening it must not
	// take longer than that call may.
	stopOpen := context.AfterFunc(ctx, cancel)
	stream, err := m.fusebox.Decide(sctx)
	if !stopOpen() {
		cancel()
		if err == nil {
			err = ctx.Err()
		}
		return nil, statusOf(err)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	s := &decideStream{
		parts:       make(chan []*pb.DecideFrame, streamQueue),
		done:        make(chan struct{}),
		cancel:      cancel,
		onAbandoned: m.onAbandoned,
		framesSent:  &m.framesSent,
		pending:     map[uint64]chan *pb.DecideResult{},
		abandoned:   map[uint64]string{},
	}
	go s.send(stream)
	go s.receive(stream)
	m.cur = s
	return s, nil
}

// close ends the open stream; later calls fail UNAVAILABLE.
func (m *mux) close() {
	m.mu.Lock()
	m.closed = true
	s := m.cur
	m.mu.Unlock()
	if s != nil {
		s.end()
	}
}

// send puts the frames ready together into one message, never splitting a
// part: a part that does not fit goes first in the next message.
func (s *decideStream) send(stream pb.Fusebox_DecideClient) {
	defer s.end()
	var next []*pb.DecideFrame
	for {
		batch := next
		next = nil
		if batch == nil {
			select {
			case batch = <-s.parts:
			case <-s.done:
				return
			}
		}
		// Appending must not write into the backing array of the part's caller.
		batch = slices.Clip(batch)
	more:
		for len(batch) < framesPerMessage {
			select {
			case part := <-s.parts:
				if len(batch)+len(part) > framesPerMessage {
					next = part
					break more
				}
				batch = append(batch, part...)
			default:
				break more
			}
		}
		if err := stream.Send(&pb.DecideRequest{Frames: batch}); err != nil {
			return
		}
		s.framesSent.Add(uint64(len(batch)))
	}
}

// receive hands each answer to its caller until the stream ends.
func (s *decideStream) receive(stream pb.Fusebox_DecideClient) {
	defer s.end()
	for {
		msg, err := stream.Recv()
		if err != nil {
			return
		}
		var late []abandonedGrant
		s.mu.Lock()
		for _, r := range msg.GetResults() {
			id := r.GetId()
			if ch, ok := s.pending[id]; ok {
				delete(s.pending, id)
				ch <- r
			} else if key, ok := s.abandoned[id]; ok {
				delete(s.abandoned, id)
				if ticket := grantedTicket(r); ticket != "" {
					late = append(late, abandonedGrant{key, ticket})
				}
			}
		}
		s.mu.Unlock()
		for _, g := range late {
			s.onAbandoned(g.key, g.ticket)
		}
	}
}

type abandonedGrant struct{ key, ticket string }

// grantedTicket is the ticket an Acquire's answer granted, if any.
func grantedTicket(r *pb.DecideResult) string {
	if r == nil {
		return ""
	}
	return r.GetAcquire().GetTicket()
}

// end closes the stream once; the callers still waiting get UNAVAILABLE.
func (s *decideStream) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	s.ended = true
	close(s.done)
	s.cancel()
	// The frames of one send share a channel: close each channel once.
	closed := make(map[chan *pb.DecideResult]bool, len(s.pending))
	for id, ch := range s.pending {
		delete(s.pending, id)
		if !closed[ch] {
			closed[ch] = true
			close(ch)
		}
	}
	clear(s.abandoned)
}

// register makes the answers of frames go to ch, which must have room
// for them all (it is closed if the stream ends first).
func (s *decideStream) register(frames []*pb.DecideFrame, ch chan *pb.DecideResult) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return false
	}
	for _, f := range frames {
		s.pending[f.GetId()] = ch
	}
	return true
}

func (s *decideStream) forget(frames []*pb.DecideFrame) {
	s.mu.Lock()
	for _, f := range frames {
		delete(s.pending, f.GetId())
	}
	s.mu.Unlock()
}

// abandon gives up the Acquire of frame id for key: a grant answered later
// is handed to onAbandoned. It returns the answer already delivered to
// answer, if there is one.
func (s *decideStream) abandon(id uint64, key string, answer chan *pb.DecideResult) *pb.DecideResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, waiting := s.pending[id]; waiting {
		delete(s.pending, id)
		s.abandoned[id] = key
		return nil
	}
	select {
	case r := <-answer: // nil when the stream ended
		return r
	default:
		return nil
	}
}

var errStreamEnded = status.Error(codes.Unavailable, "fusebox: the Decide stream ended before fusebox answered")

// call sends frame (its request set) with an id of its own and waits for
// its answer until ctx is done; a waiting Acquire given up is withdrawn
// with a cancel frame of its id.
func (m *mux) call(ctx context.Context, frame *pb.DecideFrame) (*pb.DecideResult, error) {
	if err := ctx.Err(); err != nil { // given up already: send nothing
		return nil, statusOf(err)
	}
	s, err := m.stream(ctx)
	if err != nil {
		return nil, err
	}
	id := m.nextID.Add(1)
	frame.Id = id
	part := []*pb.DecideFrame{frame}
	answer := make(chan *pb.DecideResult, 1)
	if !s.register(part, answer) {
		return nil, errStreamEnded
	}
	select {
	case s.parts <- part:
	case <-s.done:
		return nil, errStreamEnded
	case <-ctx.Done():
		s.forget(part)
		return nil, statusOf(ctx.Err())
	}
	select {
	case r, ok := <-answer:
		if !ok {
			return nil, errStreamEnded
		}
		if e := r.GetError(); e != nil {
			return nil, errorOf(e)
		}
		return r, nil
	case <-ctx.Done():
		acquire := frame.GetAcquire()
		if acquire == nil {
			s.forget(part)
			return nil, statusOf(ctx.Err())
		}
		if ticket := grantedTicket(s.abandon(id, acquire.GetKey(), answer)); ticket != "" {
			s.onAbandoned(acquire.GetKey(), ticket)
		}
		select {
		case s.parts <- []*pb.DecideFrame{{Id: id, Request: &pb.DecideFrame_Cancel{Cancel: &pb.CancelRequest{}}}}:
		default:
		}
		return nil, statusOf(ctx.Err())
	}
}

// callTogether sends frames (their requests set) in one message and waits
// for every answer until ctx is done or the stream ends. results[i] is
// frames[i]'s answer (an error answer included), nil when none came; err
// says why some did not.
func (m *mux) callTogether(ctx context.Context, frames []*pb.DecideFrame) (results []*pb.DecideResult, err error) {
	s, err := m.stream(ctx)
	if err != nil {
		return nil, err
	}
	index := make(map[uint64]int, len(frames))
	for i, f := range frames {
		f.Id = m.nextID.Add(1)
		index[f.Id] = i
	}
	answers := make(chan *pb.DecideResult, len(frames))
	if !s.register(frames, answers) {
		return nil, errStreamEnded
	}
	select {
	case s.parts <- frames:
	case <-s.done:
		return nil, errStreamEnded
	case <-ctx.Done():
		s.forget(frames)
		return nil, statusOf(ctx.Err())
	}
	results = make([]*pb.DecideResult, len(frames))
	for range frames {
		select {
		case r, ok := <-answers:
			if !ok {
				return results, errStreamEnded
			}
			results[index[r.GetId()]] = r
		case <-ctx.Done():
			s.forget(frames)
			return results, statusOf(ctx.Err())
		}
	}
	return results, nil
}

// statusOf turns a context error into the status a unary call would have
// failed with.
func statusOf(err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "fusebox: did not answer in time")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "fusebox: the call was cancelled")
	}
	return err
}

// errorOf is an error answer as the status the unary call would have
// failed with.
func errorOf(e *pb.ItemError) error {
	return status.Error(codes.Code(e.GetCode()), e.GetMessage())
}

func unexpected(r *pb.DecideResult) error {
	return status.Error(codes.Internal, fmt.Sprintf("fusebox: unexpected answer %T to a frame", r.GetResult()))
}
