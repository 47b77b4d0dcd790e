package server

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/batch"
	"github.com/b2bd/b2bd/internal/callerdeadline"
	"github.com/b2bd/b2bd/internal/callid"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
)

// APIOptions are the gRPC server options the B2B service needs: the stats
// handler (connections, leases, RPC arrival) and the interceptors that run
// each call under the daemon's CutCalls (cut.go), under the caller's
// deadline a client sent (callerdeadline) and, for a synchronous transfer
// with a call id, under its caller's CancelCall (callid).
func (s *Server) APIOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.StatsHandler(s.StatsHandler()),
		grpc.ChainUnaryInterceptor(s.unaryCut, s.unaryCaller),
		grpc.ChainStreamInterceptor(s.streamCut, s.streamCaller),
	}
}

// withCallerDeadline bounds ctx by the caller's deadline from its metadata
// (batch.CallerDeadline); cancel is nil when none was sent, and err the
// InvalidArgument status for a bad value.
func withCallerDeadline(ctx context.Context) (context.Context, context.CancelFunc, time.Duration, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	left, sent, err := callerdeadline.Parse(md.Get(callerdeadline.Key))
	if err != nil || !sent {
		return ctx, nil, 0, grpcstatus.ToStatus(err)
	}
	// From the moment its headers arrived: the time the request then waited
	// for the handler was the caller's too.
	from := time.Now()
	if b, ok := ctx.Value(beginKey{}).(*beginCtx); ok {
		from = b.at
	}
	ctx, cancel := batch.CallerDeadline(ctx, from.Add(left))
	return ctx, cancel, left, nil
}

// passed says, in a DeadlineExceeded answer, that it is the daemon's: the
// caller's deadline passed and the data path had stopped.
func passed(err error, left time.Duration) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.DeadlineExceeded {
		return err
	}
	return status.Errorf(codes.DeadlineExceeded, "the caller's deadline (%s %d) passed; the transfer stopped before this answer: %s",
		callerdeadline.Key, left.Milliseconds(), st.Message())
}

// unaryCaller runs a call under its caller's deadline (when sent) and, for
// a cancellable call with a b2b-call-id, registers it so that CancelCall
// can stop it; either answer then says the data path stopped before it.
func (s *Server) unaryCaller(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, cancel, left, err := withCallerDeadline(ctx)
	if err != nil {
		return nil, err
	}
	if cancel != nil {
		defer cancel()
	}
	id := ""
	if cancellableCalls[info.FullMethod] {
		md, _ := metadata.FromIncomingContext(ctx)
		var sent bool
		if id, sent, err = callid.Parse(md.Get(callid.Key)); err != nil {
			return nil, grpcstatus.ToStatus(err)
		}
		if sent {
			var leave func()
			if ctx, leave, err = s.calls.Begin(ctx, caller(ctx), id); err != nil {
				return nil, grpcstatus.ToStatus(err)
			}
			defer leave()
		}
	}
	resp, err := handler(ctx, req)
	if cancel != nil {
		err = passed(err, left)
		s.noteLate(ctx, info.FullMethod, left, err)
	}
	if id != "" {
		err = stoppedByCaller(ctx, err, id)
	}
	return resp, err
}

// streamCaller is unaryCaller for streams: a stream runs under its
// caller's deadline (when sent) and, a cancellable one (SubmitStream) with
// a b2b-call-id, under its caller's CancelCall, which answers once the
// stream's handler returned: every submit of it stopped.
func (s *Server) streamCaller(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel, left, err := withCallerDeadline(ss.Context())
	if err != nil {
		return err
	}
	if cancel != nil {
		defer cancel()
	}
	id := ""
	if cancellableStreams[info.FullMethod] {
		md, _ := metadata.FromIncomingContext(ctx)
		var sent bool
		if id, sent, err = callid.Parse(md.Get(callid.Key)); err != nil {
			return grpcstatus.ToStatus(err)
		}
		if sent {
			var leave func()
			if ctx, leave, err = s.calls.Begin(ctx, caller(ctx), id); err != nil {
				return grpcstatus.ToStatus(err)
			}
			defer leave()
		}
	}
	if cancel == nil && id == "" {
		return handler(srv, ss)
	}
	err = handler(srv, &deadlineStream{ServerStream: ss, ctx: ctx})
	if cancel != nil {
		err = passed(err, left)
		s.noteLate(ctx, info.FullMethod, left, err)
	}
	if id != "" {
		err = stoppedByCaller(ctx, err, id)
	}
	return err
}

// lateAnswer is how far past its caller's deadline a call's answer is
// logged: a deadline this daemon did not keep.
const lateAnswer = 50 * time.Millisecond

// noteLate logs a call answered more than lateAnswer past its caller's
// deadline (left, from the moment its headers arrived), at most once a
// second: a daemon that was stopped answers its queue late all at once.
func (s *Server) noteLate(ctx context.Context, method string, left time.Duration, err error) {
	b, ok := ctx.Value(beginKey{}).(*beginCtx)
	if !ok {
		return
	}
	late := time.Since(b.at) - left
	if late <= lateAnswer {
		return
	}
	if more, ok := s.late.due(time.Now()); ok {
		s.cfg.Log.Warn("a call was answered past its caller's deadline", "method", method, "deadline", left,
			"late", late, "more_since_last_warning", more, "error", err)
	}
}

// lateLog rate-limits noteLate's warnings, counting those it drops.
type lateLog struct {
	last    atomic.Int64 // unix ns of the last warning
	dropped atomic.Uint64
}

// due says whether a warning may go now, and how many were dropped since
// the last one.
func (l *lateLog) due(now time.Time) (uint64, bool) {
	last := l.last.Load()
	if now.UnixNano()-last < int64(time.Second) || !l.last.CompareAndSwap(last, now.UnixNano()) {
		l.dropped.Add(1)
		return 0, false
	}
	return l.dropped.Swap(0), true
}

type deadlineStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (d *deadlineStream) Context() context.Context { return d.ctx }
