package fusebox

// The client's calls multiplexed over one Decide stream per client
// (TransportStream): each call is a frame with an id of its own, the frames
// ready together go out in one message, and each answer is handed to its
// caller by id. The stream is opened on the first call and again after it
// ends (the calls in flight on it fail UNAVAILABLE, as a broken unary call
// would).

import (
	"context"
	"errors"
	"fmt"
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
	// streamQueue is how many frames may wait for the stream at most (a
	// caller past it waits).
	streamQueue = 10_000
	// framesPerMessage is the most frames sent in one message (the
	// server's limit).
	framesPerMessage = 1_000
)

// mux is one client's Decide stream, opened on demand.
type mux struct {
	fusebox pb.FuseboxClient
	nextID  atomic.Uint64

	mu     sync.Mutex
	cur    *decideStream // nil until opened; replaced once ended
	closed bool
}

// decideStream is one open Decide stream.
type decideStream struct {
	frames chan *pb.DecideFrame
	done   chan struct{} // closed when the stream has ended
	cancel context.CancelFunc

	mu      sync.Mutex
	ended   bool
	pending map[uint64]chan *pb.DecideResult
}

func newMux(fusebox pb.FuseboxClient) *mux { return &mux{fusebox: fusebox} }

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
		frames:  make(chan *pb.DecideFrame, streamQueue),
		done:    make(chan struct{}),
		cancel:  cancel,
		pending: map[uint64]chan *pb.DecideResult{},
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

// send puts the frames ready together into one message.
func (s *decideStream) send(stream pb.Fusebox_DecideClient) {
	defer s.end()
	for {
		var first *pb.DecideFrame
		select {
		case first = <-s.frames:
		case <-s.done:
			return
		}
		batch := []*pb.DecideFrame{first}
	more:
		for len(batch) < framesPerMessage {
			select {
			case f := <-s.frames:
				batch = append(batch, f)
			default:
				break more
			}
		}
		if err := stream.Send(&pb.DecideRequest{Frames: batch}); err != nil {
			return
		}
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
		s.mu.Lock()
		for _, r := range msg.GetResults() {
			if ch, ok := s.pending[r.GetId()]; ok {
				delete(s.pending, r.GetId())
				ch <- r
			}
		}
		s.mu.Unlock()
	}
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
	for id, ch := range s.pending {
		delete(s.pending, id)
		close(ch)
	}
}

// register makes id's answer go to the returned channel (closed if the
// stream ends first).
func (s *decideStream) register(id uint64) (chan *pb.DecideResult, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil, false
	}
	ch := make(chan *pb.DecideResult, 1)
	s.pending[id] = ch
	return ch, true
}

func (s *decideStream) forget(id uint64) {
	s.mu.Lock()
	delete(s.pending, id)
	s.mu.Unlock()
}

var errStreamEnded = status.Error(codes.Unavailable, "fusebox: the Decide stream ended before fusebox answered")

// call sends frame (its request set) with an id of its own and waits for
// its answer until ctx is done; a waiting Acquire given up is withdrawn
// with a cancel frame of its id.
func (m *mux) call(ctx context.Context, frame *pb.DecideFrame) (*pb.DecideResult, error) {
	s, err := m.stream(ctx)
	if err != nil {
		return nil, err
	}
	id := m.nextID.Add(1)
	frame.Id = id
	answer, ok := s.register(id)
	if !ok {
		return nil, errStreamEnded
	}
	select {
	case s.frames <- frame:
	case <-s.done:
		return nil, errStreamEnded
	case <-ctx.Done():
		s.forget(id)
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
		s.forget(id)
		if frame.GetAcquire() != nil {
			select {
			case s.frames <- &pb.DecideFrame{Id: id, Request: &pb.DecideFrame_Cancel{Cancel: &pb.CancelRequest{}}}:
			default:
			}
		}
		return nil, statusOf(ctx.Err())
	}
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
