package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/desc"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
	"github.com/b2bd/b2bd/server"
)

// asyncRig is two nodes over bufconn and a source region on a, a
// destination exported by b, and a peer that never answers (a transfer to
// it runs until cancelled).
type asyncRig struct {
	a, b   *node
	src    string
	silent string
}

func newAsyncRig(t *testing.T, maxTransfers int) *asyncRig {
	t.Helper()
	bn := bufNet{}
	a := newNodeWith(t, "a", bn, func(c *server.Config) { c.MaxTransfers = maxTransfers })
	b := newNode(t, "b", bn)
	ctx := context.Background()
	src, err := a.api.RegisterRegion(ctx, hostAlloc(1<<16, ""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.api.RegisterRegion(ctx, hostAlloc(1<<16, "dst")); err != nil {
		t.Fatal(err)
	}
	silent, err := listenSilent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	return &asyncRig{a: a, b: b, src: src.GetRegion().GetId(), silent: silent.Addr().String()}
}

// batch is a one-block batch to peer.
func (r *asyncRig) batch(peer string) *b2bv1.StartTransferRequest {
	return &b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Batch{Batch: &b2bv1.BatchTransferRequest{
		SrcRegionId: r.src, Peer: peer, DstRegion: "dst",
		Descriptors: &b2bv1.Descriptors{SrcOffsets: desc.Pack([]uint64{0}), DstOffsets: desc.Pack([]uint64{4096}), BlockLength: 4096},
	}}}
}

// hang starts a transfer that runs until cancelled (60 s deadline).
func (r *asyncRig) hang(t *testing.T, api b2bv1.B2BClient) uint64 {
	t.Helper()
	req := r.batch(r.silent)
	req.TimeoutMs = 60_000
	resp, err := api.StartTransfer(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetTransferId() == 0 {
		t.Fatal("transfer id 0")
	}
	return resp.GetTransferId()
}

func statusOf(t *testing.T, api b2bv1.B2BClient) *b2bv1.StatusResponse {
	t.Helper()
	st, err := api.Status(context.Background(), &b2bv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestAsyncTransfers(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		max  int
		run  func(t *testing.T, r *asyncRig)
	}{
		{"done is reported once, with its result", 0, func(t *testing.T, r *asyncRig) {
			id, err := r.a.api.StartTransfer(ctx, r.batch("b:7470"))
			if err != nil {
				t.Fatal(err)
			}
			o, err := r.a.api.WaitTransfer(ctx, &b2bv1.WaitTransferRequest{TransferId: id.GetTransferId()})
			if err != nil {
				t.Fatal(err)
			}
			if o.GetState() != b2bv1.TransferState_TRANSFER_STATE_DONE || o.GetResult().GetBlocks() != 1 || o.GetTransferId() != id.GetTransferId() {
				t.Fatalf("outcome %v, want DONE with 1 block", o)
			}
			_, err = r.a.api.WaitTransfer(ctx, &b2bv1.WaitTransferRequest{TransferId: id.GetTransferId()})
			wantStatus(t, err, codes.NotFound, "is not a transfer of this client")
			_, err = r.a.api.PollTransfers(ctx, &b2bv1.PollTransfersRequest{TransferIds: []uint64{id.GetTransferId()}})
			wantStatus(t, err, codes.NotFound, "transfer_ids[0]")
		}},
		{"another client's id is unknown to it", 0, func(t *testing.T, r *asyncRig) {
			id := r.hang(t, r.a.api)
			cc := r.a.dial()
			defer cc.Close()
			other := b2bv1.NewB2BClient(cc)
			_, err := other.WaitTransfer(ctx, &b2bv1.WaitTransferRequest{TransferId: id, TimeoutMs: 1})
			wantStatus(t, err, codes.NotFound, "is not a transfer of this client")
			_, err = other.PollTransfers(ctx, &b2bv1.PollTransfersRequest{TransferIds: []uint64{id}})
			wantStatus(t, err, codes.NotFound, "transfer_ids[0]")
			_, err = other.CancelTransfer(ctx, &b2bv1.CancelTransferRequest{TransferId: id})
			wantStatus(t, err, codes.NotFound, "is not a transfer of this client")
			// Still the owner's, still running.
			p, err := r.a.api.PollTransfers(ctx, &b2bv1.PollTransfersRequest{TransferIds: []uint64{id}})
			if err != nil || p.GetOutcomes()[0].GetState() != b2bv1.TransferState_TRANSFER_STATE_RUNNING {
				t.Fatalf("owner's poll: %v, %v; want RUNNING", p, err)
			}
			o, err := r.a.api.CancelTransfer(ctx, &b2bv1.CancelTransferRequest{TransferId: id})
			if err != nil || o.GetState() != b2bv1.TransferState_TRANSFER_STATE_CANCELLED || codes.Code(o.GetCode()) != codes.Canceled {
				t.Fatalf("cancel: %v, %v; want CANCELLED with code Canceled", o, err)
			}
			_, err = r.a.api.CancelTransfer(ctx, &b2bv1.CancelTransferRequest{TransferId: id})
			wantStatus(t, err, codes.NotFound, "is not a transfer of this client")
		}},
		{"a wait that times out says RUNNING", 0, func(t *testing.T, r *asyncRig) {
			id := r.hang(t, r.a.api)
			o, err := r.a.api.WaitTransfer(ctx, &b2bv1.WaitTransferRequest{TransferId: id, TimeoutMs: 20})
			if err != nil || o.GetState() != b2bv1.TransferState_TRANSFER_STATE_RUNNING {
				t.Fatalf("wait: %v, %v; want RUNNING", o, err)
			}
			if _, err := r.a.api.CancelTransfer(ctx, &b2bv1.CancelTransferRequest{TransferId: id}); err != nil {
				t.Fatal(err)
			}
		}},
		{"the bound per client names the flag; freed ids count again", 2, func(t *testing.T, r *asyncRig) {
			first := r.hang(t, r.a.api)
			r.hang(t, r.a.api)
			_, err := r.a.api.StartTransfer(ctx, r.batch(r.silent))
			wantStatus(t, err, codes.ResourceExhausted, "the limit (--max-transfers-per-client) is 2")
			// Another client has its own bound.
			cc := r.a.dial()
			defer cc.Close()
			r.hang(t, b2bv1.NewB2BClient(cc))
			if _, err := r.a.api.CancelTransfer(ctx, &b2bv1.CancelTransferRequest{TransferId: first}); err != nil {
				t.Fatal(err)
			}
			r.hang(t, r.a.api)
		}},
		{"a poll with an unknown id reports none", 0, func(t *testing.T, r *asyncRig) {
			id, err := r.a.api.StartTransfer(ctx, r.batch("b:7470"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.a.api.WaitTransfer(ctx, &b2bv1.WaitTransferRequest{TransferId: id.GetTransferId(), TimeoutMs: 1}); err != nil {
				t.Fatal(err)
			}
			// It may have been reported by that wait; start another and
			// poll it with an unknown id beside it.
			id2 := r.hang(t, r.a.api)
			_, err = r.a.api.PollTransfers(ctx, &b2bv1.PollTransfersRequest{TransferIds: []uint64{id2, 999999}})
			wantStatus(t, err, codes.NotFound, "transfer_ids[1] 999999")
			_, err = r.a.api.PollTransfers(ctx, &b2bv1.PollTransfersRequest{TransferIds: []uint64{id2, id2}})
			wantStatus(t, err, codes.InvalidArgument, "transfer_ids[1] = ")
			o, err := r.a.api.CancelTransfer(ctx, &b2bv1.CancelTransferRequest{TransferId: id2})
			if err != nil || o.GetState() != b2bv1.TransferState_TRANSFER_STATE_CANCELLED {
				t.Fatalf("cancel after the refused polls: %v, %v", o, err)
			}
		}},
		{"bad input is refused at start", 0, func(t *testing.T, r *asyncRig) {
			_, err := r.a.api.StartTransfer(ctx, &b2bv1.StartTransferRequest{})
			wantStatus(t, err, codes.InvalidArgument, "transfer is not set")
			big := r.batch("b:7470")
			big.TimeoutMs = 1 << 40
			_, err = r.a.api.StartTransfer(ctx, big)
			wantStatus(t, err, codes.InvalidArgument, "timeout_ms is 1099511627776, over the limit of 3600000")
			bad := r.batch("b:7470")
			bad.GetBatch().SrcRegionId = ""
			_, err = r.a.api.StartTransfer(ctx, bad)
			wantStatus(t, err, codes.InvalidArgument, "src_region_id is empty")
			_, err = r.a.api.WaitTransfer(ctx, &b2bv1.WaitTransferRequest{TransferId: 0})
			wantStatus(t, err, codes.NotFound, "transfer_id 0")
		}},
		{"a watcher gets each outcome once", 0, func(t *testing.T, r *asyncRig) {
			wctx, stop := context.WithCancel(ctx)
			defer stop()
			w, err := r.a.api.WatchTransfers(wctx, &b2bv1.WatchTransfersRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Header(); err != nil { // subscribed
				t.Fatal(err)
			}
			id, err := r.a.api.StartTransfer(ctx, r.batch("b:7470"))
			if err != nil {
				t.Fatal(err)
			}
			o, err := w.Recv()
			if err != nil || o.GetTransferId() != id.GetTransferId() || o.GetState() != b2bv1.TransferState_TRANSFER_STATE_DONE {
				t.Fatalf("watched %v, %v; want transfer %d DONE", o, err, id.GetTransferId())
			}
			_, err = r.a.api.WaitTransfer(ctx, &b2bv1.WaitTransferRequest{TransferId: id.GetTransferId()})
			wantStatus(t, err, codes.NotFound, "is not a transfer of this client")
			stop()
			if _, err := w.Recv(); status.Code(err) != codes.Canceled {
				t.Fatalf("stream after its context ended: %v, want Canceled", err)
			}
		}},
		{"a client gone has its transfers cancelled and ids freed", 0, func(t *testing.T, r *asyncRig) {
			cc := r.a.dial()
			api := b2bv1.NewB2BClient(cc)
			for range 3 {
				r.hang(t, api)
			}
			if st := statusOf(t, r.a.api); st.GetTransfersInFlight() != 3 || st.GetTransfersHeld() != 3 {
				t.Fatalf("status: %d in flight, %d held; want 3, 3", st.GetTransfersInFlight(), st.GetTransfersHeld())
			}
			cc.Close()
			// The server learns of the closed connection on its own
			// time: wait for it, bounded.
			deadline := time.Now().Add(10 * time.Second)
			for {
				st := statusOf(t, r.a.api)
				if st.GetTransfersInFlight() == 0 && st.GetTransfersHeld() == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("10 s after the client left: %d in flight, %d held", st.GetTransfersInFlight(), st.GetTransfersHeld())
				}
				time.Sleep(10 * time.Millisecond)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newAsyncRig(t, c.max)
			c.run(t, r)
		})
	}
}
