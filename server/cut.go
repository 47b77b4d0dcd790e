package server

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Calls still running when the daemon's shutdown grace ends are cut: their
// contexts are cancelled, so that each answers Unavailable saying why,
// before the servers stop and close the connections (which would leave the
// caller with the transport's bare "Socket closed").

// cutter cancels the API calls in flight once cut.
type cutter struct {
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	why    string
}

func newCutter() *cutter {
	ctx, cancel := context.WithCancel(context.Background())
	return &cutter{ctx: ctx, cancel: cancel}
}

// CutCalls cancels every API call in flight and every later one; each
// answers Unavailable with why. For the end of the shutdown grace, before
// the servers stop. Safe twice (the first why stays).
func (s *Server) CutCalls(why string) {
	c := s.cut
	c.mu.Lock()
	if c.why == "" {
		c.why = why
	}
	c.mu.Unlock()
	c.cancel()
}

// within runs a call under the cutter: its context ends when calls are
// cut; done undoes that.
func (c *cutter) within(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// answer is err, or, once calls were cut, Unavailable naming why.
func (c *cutter) answer(err error) error {
	if err == nil || c.ctx.Err() == nil {
		return err
	}
	c.mu.Lock()
	why := c.why
	c.mu.Unlock()
	return status.Error(codes.Unavailable, fmt.Sprintf("%s; the call was cut: %s", why, status.Convert(err).Message()))
}

// unaryCut and streamCut are the cutter's interceptors (APIOptions).
func (s *Server) unaryCut(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, done := s.cut.within(ctx)
	defer done()
	resp, err := handler(ctx, req)
	return resp, s.cut.answer(err)
}

func (s *Server) streamCut(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, done := s.cut.within(ss.Context())
	defer done()
	err := handler(srv, &deadlineStream{ServerStream: ss, ctx: ctx})
	if err == nil && s.cut.ctx.Err() != nil && ss.Context().Err() == nil {
		// A stream that ended because of the cut (a watch) did not end well.
		err = status.Error(codes.Canceled, "ended")
	}
	return s.cut.answer(err)
}
