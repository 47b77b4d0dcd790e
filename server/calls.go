package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/callid"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// cancellableCalls are the synchronous calls that move bytes while their
// caller waits and honour a b2b-call-id (callid): CancelCall stops one, and
// it answers once its data path stopped.
var cancellableCalls = map[string]bool{
	b2bv1.B2B_BatchTransfer_FullMethodName:  true,
	b2bv1.B2B_SubmitTransfer_FullMethodName: true,
	b2bv1.B2B_TransferBlocks_FullMethodName: true,
}

// cancellableStreams are the streams that honour a b2b-call-id likewise:
// CancelCall stops every submit of the stream, and answers once the stream
// ended.
var cancellableStreams = map[string]bool{
	b2bv1.B2B_SubmitStream_FullMethodName: true,
}

// stoppedByCaller rewrites a call's Canceled answer when its caller's
// CancelCall cut it, to say the answer came after the data path stopped.
func stoppedByCaller(ctx context.Context, err error, id string) error {
	if err == nil || !errors.Is(context.Cause(ctx), callid.ErrCancelled) {
		return err
	}
	st := status.Convert(err)
	if st.Code() != codes.Canceled {
		return err // it ended otherwise before the cancel took hold
	}
	return status.Errorf(codes.Canceled, "the caller cancelled the call (%s %s); the transfer stopped before this answer: %s",
		callid.Key, id, st.Message())
}

func (l *local) CancelCall(ctx context.Context, req *b2bv1.CancelCallRequest) (*b2bv1.CancelCallResponse, error) {
	id := req.GetCallId()
	if err := callid.Check("call_id", id); err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	ended, err := l.s.calls.Cancel(caller(ctx), id, time.Now())
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	if ended == nil {
		return &b2bv1.CancelCallResponse{}, nil
	}
	// As CancelTransfer: the answer means no byte of the call can land any
	// more, so a client interrupted anywhere (even before it held the
	// call's answer) needs nothing else.
	select {
	case <-ended:
		return &b2bv1.CancelCallResponse{InFlight: true}, nil
	case <-ctx.Done():
		return nil, grpcstatus.ToStatus(fmt.Errorf("cancel of call %s: stopped, still ending when this CancelCall ended: %w", id, ctx.Err()))
	}
}
