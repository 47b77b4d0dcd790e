package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// The control workload's async rows, on a prepared 1 × ControlBlockBytes
// plan: "start_poll", one async start and the polls until its outcome
// (gRPC: StartTransfer, then PollTransfers until it ended; ring: a submit
// record, then its completion, which is the handle's outcome); and
// "start_batch64", ControlBatch starts in one call and one wait for them
// all (gRPC: StartTransfers, WaitTransfers; ring: ControlBatch records,
// then their completions), timed per request.
const (
	ControlAsyncCalls = 1000
	ControlBatch      = 64
	ControlBatchCalls = 100 // batches of ControlBatch per path
)

// controlAsync times the async rows and checks the bytes landed.
func controlAsync(ctx context.Context, cfg Config, eps *endpoints, ring *client.Ring, src, dst *client.HostRegion, export string,
	add func(op string, blocks int, grpcS, ringS []time.Duration)) error {
	plan, err := eps.src.Prepare(ctx, client.Transfer{SrcRegion: src.Id, Peer: eps.dstPeer, DstRegion: export,
		Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: ControlBlockBytes}})
	if err != nil {
		return fmt.Errorf("async rows: prepare: %w", err)
	}
	defer plan.Release(context.WithoutCancel(ctx))
	r := rand.New(rand.NewPCG(cfg.Seed, 64))
	landed := func(what string) error {
		if !bytes.Equal(src.Bytes[:ControlBlockBytes], dst.Bytes[:ControlBlockBytes]) {
			return fmt.Errorf("%s: the destination block differs from the source", what)
		}
		return nil
	}
	fresh := func() {
		for i := range src.Bytes[:ControlBlockBytes] {
			src.Bytes[i] = byte(r.Uint32())
		}
	}

	grpcStartPoll := func() error {
		h, err := eps.src.StartSubmit(ctx, plan.Handle, 0)
		if err != nil {
			return err
		}
		hs := []*client.TransferHandle{h}
		for {
			out, err := eps.src.Poll(ctx, hs)
			if err != nil {
				return err
			}
			if err := outcomeErr(out[0]); !errors.Is(err, errRunning) {
				return err
			}
		}
	}
	ringStartPoll := func() error {
		tag, err := ring.Start(plan)
		if err != nil {
			return err
		}
		_, err = ring.Wait(tag)
		return err
	}
	fresh()
	gs, rs, err := interleave(ControlAsyncCalls, grpcStartPoll, ringStartPoll)
	if err == nil {
		err = landed("start_poll, both paths")
	}
	if err != nil {
		return fmt.Errorf("start_poll: %w", err)
	}
	add("start_poll", 1, gs, rs)

	reqs := make([]*b2bv1.StartTransferRequest, ControlBatch)
	for i := range reqs {
		reqs[i] = &b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Submit{Submit: &b2bv1.SubmitTransferRequest{Handle: plan.Handle}}}
	}
	hs := make([]*client.TransferHandle, ControlBatch)
	grpcBatch := func() error {
		started, err := eps.src.StartMany(ctx, reqs...)
		if err != nil {
			return err
		}
		for i, s := range started {
			if s.Err != nil {
				return fmt.Errorf("start %d of %d: %w", i, len(started), s.Err)
			}
			hs[i] = s.Handle
		}
		out, err := eps.src.WaitMany(ctx, hs, 0, false)
		if err != nil {
			return err
		}
		for i, o := range out {
			if err := outcomeErr(o); err != nil {
				return fmt.Errorf("transfer %d of %d: %w", i, len(out), err)
			}
		}
		return nil
	}
	tags := make([]uint64, ControlBatch)
	ringBatch := func() error {
		for i := range tags {
			var err error
			if tags[i], err = ring.Start(plan); err != nil {
				for _, t := range tags[:i] { // every tag posted is waited for
					_, _ = ring.Wait(t)
				}
				return err
			}
		}
		var first error
		for i, t := range tags {
			if _, err := ring.Wait(t); err != nil && first == nil {
				first = fmt.Errorf("transfer %d of %d: %w", i, len(tags), err)
			}
		}
		return first
	}
	fresh()
	gb, rb, err := interleave(ControlBatchCalls, grpcBatch, ringBatch)
	if err == nil {
		err = landed("start_batch64, both paths")
	}
	if err != nil {
		return fmt.Errorf("start_batch64: %w", err)
	}
	perRequest := func(s []time.Duration) []time.Duration {
		for i := range s {
			s[i] /= ControlBatch
		}
		return s
	}
	add("start_batch64", 1, perRequest(gb), perRequest(rb))
	return nil
}

// errRunning: an outcome that has not ended.
var errRunning = errors.New("running")

// outcomeErr is nil for a DONE outcome, errRunning for a running one, and
// an error naming the state and message otherwise.
func outcomeErr(o *b2bv1.TransferOutcome) error {
	switch o.GetState() {
	case b2bv1.TransferState_TRANSFER_STATE_DONE:
		return nil
	case b2bv1.TransferState_TRANSFER_STATE_RUNNING, b2bv1.TransferState_TRANSFER_STATE_UNSPECIFIED:
		return errRunning
	}
	return fmt.Errorf("transfer %d %s: code %d: %s", o.GetTransferId(), o.GetState(), o.GetCode(), o.GetMessage())
}
