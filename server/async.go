package server

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/batch"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Async handles (docs/kv.md): thin handlers over batch.Transfers. A
// transfer belongs to the calling client as leases.go tracks it (a process
// on the Unix socket, else one connection), and is cancelled when that
// client is gone (Server.leave).

// clientID is the client of this call's connection; 0 when connections
// are not tracked (no stats handler): such callers share one client.
func clientID(ctx context.Context) uint64 {
	if c, ok := ctx.Value(connKey{}).(*connCtx); ok && c.client != nil {
		return c.client.ID
	}
	return 0
}

// timeoutMs converts a timeout_ms field, bounded by maxTransferTimeout.
func timeoutMs(field string, ms uint64) (time.Duration, error) {
	if time.Duration(ms) > maxTransferTimeout/time.Millisecond {
		return 0, fmt.Errorf("%w: %s is %d, over the limit of %d", errs.ErrInvalidArgument, field, ms, maxTransferTimeout.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

func (l *local) StartTransfer(ctx context.Context, req *b2bv1.StartTransferRequest) (*b2bv1.StartTransferResponse, error) {
	id, err := l.start(ctx, req)
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return &b2bv1.StartTransferResponse{TransferId: id}, nil
}

func (l *local) start(ctx context.Context, req *b2bv1.StartTransferRequest) (uint64, error) {
	timeout, err := timeoutMs("timeout_ms", req.GetTimeoutMs())
	if err != nil {
		return 0, err
	}
	r := batch.StartRequest{Client: clientID(ctx), Caller: caller(ctx)}
	if after := req.GetAfter(); after != nil {
		r.After = &batch.Trigger{Region: after.GetCounterRegionId(), Offset: after.GetCounterOffset(), Value: after.GetValue(),
			NoteRegion: after.GetNoteRegionId(), NoteKey: after.GetNoteKey()}
	}
	switch t := req.GetTransfer().(type) {
	case *b2bv1.StartTransferRequest_Batch:
		br := transferRequest(t.Batch, r.Caller)
		r.Batch = &br
	case *b2bv1.StartTransferRequest_Submit:
		r.Submit = &batch.SubmitRequest{Owner: owner(ctx), Handle: t.Submit.GetHandle()}
	case *b2bv1.StartTransferRequest_Blocks:
		br, own, err := blocksRequest(ctx, t.Blocks)
		if timeout == 0 {
			timeout = own
		}
		r.Blocks, r.Bad = &br, err
	}
	r.Timeout = timeout
	return l.s.batches.Start(r)
}

func (l *local) WaitTransfer(ctx context.Context, req *b2bv1.WaitTransferRequest) (*b2bv1.TransferOutcome, error) {
	timeout, err := timeoutMs("timeout_ms", req.GetTimeoutMs())
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	o, err := l.s.batches.Transfers().Wait(ctx, clientID(ctx), req.GetTransferId(), timeout)
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return outcomeProto(o), nil
}

func (l *local) PollTransfers(ctx context.Context, req *b2bv1.PollTransfersRequest) (*b2bv1.PollTransfersResponse, error) {
	os, err := l.s.batches.Transfers().Poll(clientID(ctx), req.GetTransferIds())
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	resp := &b2bv1.PollTransfersResponse{Outcomes: make([]*b2bv1.TransferOutcome, len(os))}
	for i, o := range os {
		resp.Outcomes[i] = outcomeProto(o)
	}
	return resp, nil
}

func (l *local) CancelTransfer(ctx context.Context, req *b2bv1.CancelTransferRequest) (*b2bv1.TransferOutcome, error) {
	o, err := l.s.batches.Transfers().Cancel(ctx, clientID(ctx), req.GetTransferId())
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return outcomeProto(o), nil
}

func (l *local) WatchTransfers(_ *b2bv1.WatchTransfersRequest, stream b2bv1.B2B_WatchTransfersServer) error {
	ctx := stream.Context()
	t := l.s.batches.Transfers()
	w := t.Watch(clientID(ctx))
	defer t.Unwatch(w)
	// Headers tell the client it is subscribed: transfers ending after
	// this are seen.
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	for {
		for _, o := range w.Next() {
			if err := stream.Send(outcomeProto(o)); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.C:
		}
	}
}

func outcomeProto(o batch.Outcome) *b2bv1.TransferOutcome {
	out := &b2bv1.TransferOutcome{TransferId: o.ID}
	switch o.State {
	case batch.Running:
		out.State = b2bv1.TransferState_TRANSFER_STATE_RUNNING
	case batch.Done:
		out.State = b2bv1.TransferState_TRANSFER_STATE_DONE
		out.Result = transferResponse(o.Result)
	case batch.Failed, batch.Cancelled:
		out.State = b2bv1.TransferState_TRANSFER_STATE_FAILED
		if o.State == batch.Cancelled {
			out.State = b2bv1.TransferState_TRANSFER_STATE_CANCELLED
		}
		st := status.Convert(grpcstatus.ToStatus(o.Err))
		out.Code, out.Message = uint32(st.Code()), st.Message()
	}
	return out
}
