package client

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/callerdeadline"
	"github.com/b2bd/b2bd/internal/callid"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// timedCalls are the calls that move bytes while the caller waits. Each is
// sent with the caller's deadline in metadata (callerdeadline.Key) and a
// gRPC deadline callerdeadline.Grace later, so that the DeadlineExceeded
// the caller gets is the daemon's, sent after the data path stopped: a pull
// writes the caller's memory, and nothing may land there after the answer.
// gRPC's own deadline would answer at once, whatever the daemon was doing.
var timedCalls = map[string]bool{
	b2bv1.B2B_BatchTransfer_FullMethodName:  true,
	b2bv1.B2B_SubmitTransfer_FullMethodName: true,
	b2bv1.B2B_TransferBlocks_FullMethodName: true,
	b2bv1.B2B_SubmitStream_FullMethodName:   true,
}

// deadlineCalls move no bytes but reach the peer (handshake, resolve,
// connect) as a transfer does, so a peer that does not answer holds them
// to the caller's deadline. They are sent with that deadline in metadata
// and a gRPC deadline callerdeadline.Grace later, as timedCalls are, so
// that the DeadlineExceeded is the daemon's, naming the peer and the
// phase, not gRPC's bare "context deadline exceeded". No call id: nothing
// lands after their answer, so the caller's cancel cancels the call itself.
var deadlineCalls = map[string]bool{
	b2bv1.B2B_PrepareTransfer_FullMethodName: true,
	b2bv1.B2B_WarmTransfer_FullMethodName:    true,
}

// callerDeadline turns ctx's deadline into the metadata and a later gRPC
// deadline; the caller's cancel (not its deadline) still cancels the call.
// ok is false when ctx has no deadline (or one beyond callerdeadline.Max,
// or already passed), and the call goes as it is.
func callerDeadline(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	call, cancel, ok := sendDeadline(ctx, context.WithoutCancel(ctx))
	if !ok {
		return ctx, nil, false
	}
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
	return call, func() { stop(); cancel() }, true
}

// sendDeadline gives call ctx's deadline in the metadata and a gRPC
// deadline callerdeadline.Grace later; ok is false, and call is returned
// as it is, when ctx has no deadline the daemon takes (none, past, or
// beyond callerdeadline.Max).
func sendDeadline(ctx, call context.Context) (context.Context, context.CancelFunc, bool) {
	d, ok := ctx.Deadline()
	if !ok {
		return call, func() {}, false
	}
	v, ok := callerdeadline.Format(time.Until(d))
	if !ok {
		return call, func() {}, false
	}
	call, cancel := context.WithDeadline(call, d.Add(callerdeadline.Grace))
	return metadata.AppendToOutgoingContext(call, callerdeadline.Key, v), cancel, true
}

// unaryCallerDeadline sends a timed call with its caller's deadline (see
// callerDeadline) and, when the caller can cancel it, with a fresh call id
// (callid): the caller's cancel then goes to the daemon as CancelCall, and
// the call returns the daemon's answer, which comes once the transfer
// stopped. So no byte of a cancelled pull lands after the call returned.
// When CancelCall fails (a daemon too old to know it, or unreachable), or
// no answer comes within callerdeadline.Grace, the call is cancelled at
// the client as before.
func unaryCallerDeadline(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if deadlineCalls[method] && ctx.Err() == nil {
		if call, cancel, ok := callerDeadline(ctx); ok {
			defer cancel()
			return invoker(call, method, req, reply, cc, opts...)
		}
	}
	if !timedCalls[method] || ctx.Done() == nil || ctx.Err() != nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	call, hardCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hardCancel()
	call, cancelDeadline, daemonDeadline := sendDeadline(ctx, call)
	defer cancelDeadline()
	id := callid.New()
	call = metadata.AppendToOutgoingContext(call, callid.Key, id)
	answered := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		if daemonDeadline && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return // the daemon answers at the deadline it was sent
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callerdeadline.Grace)
		defer cancel()
		if _, err := b2bv1.NewB2BClient(cc).CancelCall(cctx, &b2bv1.CancelCallRequest{CallId: id}); err != nil {
			hardCancel()
			return
		}
		select {
		case <-answered:
		case <-cctx.Done():
			hardCancel()
		}
	})
	defer stop()
	err := invoker(call, method, req, reply, cc, opts...)
	close(answered)
	if !daemonDeadline && errors.Is(ctx.Err(), context.DeadlineExceeded) && status.Code(err) == codes.Canceled {
		// A deadline the daemon was not sent (over callerdeadline.Max) was
		// carried out as a CancelCall: the caller asked for a deadline.
		return status.Error(codes.DeadlineExceeded, status.Convert(err).Message())
	}
	return err
}

func streamCallerDeadline(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if !timedCalls[method] {
		return streamer(ctx, desc, cc, method, opts...)
	}
	call, cancel, ok := callerDeadline(ctx)
	if !ok {
		return streamer(ctx, desc, cc, method, opts...)
	}
	s, err := streamer(call, desc, cc, method, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	return &deadlineStream{ClientStream: s, cancel: cancel}, nil
}

// deadlineStream releases the call's context once the stream has ended
// (its receive failed: io.EOF or the status).
type deadlineStream struct {
	grpc.ClientStream
	cancel context.CancelFunc
}

func (d *deadlineStream) RecvMsg(m any) error {
	err := d.ClientStream.RecvMsg(m)
	if err != nil {
		d.cancel()
	}
	return err
}
