package server_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/b2bd/b2bd/internal/desc"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
	"github.com/b2bd/b2bd/server"
)

// manyRig is asyncRig with a 64 KiB source of random bytes: block i (512
// bytes) of it goes to block i of "dst".
type manyRig struct {
	*asyncRig
	dstID string
}

const manyBlock = 512

func newManyRig(t *testing.T, maxTransfers int) *manyRig {
	t.Helper()
	r := newAsyncRig(t, maxTransfers)
	ctx := context.Background()
	ls, err := r.a.api.ListRegions(ctx, &b2bv1.ListRegionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	buf := make([]byte, 1<<16)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	for _, g := range ls.GetRegions() {
		if g.GetId() == r.src {
			if err := os.WriteFile(g.GetShmPath(), buf, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	lb, err := r.b.api.ListRegions(ctx, &b2bv1.ListRegionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return &manyRig{asyncRig: r, dstID: lb.GetRegions()[0].GetId()}
}

// block is a start of source block i into destination block i.
func (r *manyRig) block(i int) *b2bv1.StartTransferRequest {
	o := desc.Pack([]uint64{uint64(i * manyBlock)})
	return &b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Batch{Batch: &b2bv1.BatchTransferRequest{
		SrcRegionId: r.src, Peer: "b:7470", DstRegion: "dst",
		Descriptors: &b2bv1.Descriptors{SrcOffsets: o, DstOffsets: o, BlockLength: manyBlock},
	}}}
}

// digests are the per-block checksums of blocks ids of a region.
func digests(t *testing.T, api b2bv1.B2BClient, region string, ids []int) []byte {
	t.Helper()
	off := make([]uint64, len(ids))
	for k, i := range ids {
		off[k] = uint64(i * manyBlock)
	}
	c, err := api.Checksum(context.Background(), &b2bv1.ChecksumRequest{RegionId: region, Offsets: desc.Pack(off), BlockLength: manyBlock, PerBlock: true})
	if err != nil {
		t.Fatal(err)
	}
	return c.GetBlockDigests()
}

func TestStartTransfers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cases := []struct {
		name string
		max  int
		// reqs builds the call; bad maps a request's index to the code and
		// the text its refusal must carry.
		reqs func(r *manyRig) []*b2bv1.StartTransferRequest
		bad  map[int]struct {
			code codes.Code
			text string
		}
	}{
		{"64 blocks, every one lands", 0, func(r *manyRig) []*b2bv1.StartTransferRequest {
			var rs []*b2bv1.StartTransferRequest
			for i := range 64 {
				rs = append(rs, r.block(i))
			}
			return rs
		}, nil},
		{"a bad request gets its own answer; the others run", 0, func(r *manyRig) []*b2bv1.StartTransferRequest {
			var rs []*b2bv1.StartTransferRequest
			for i := range 64 {
				rs = append(rs, r.block(i))
			}
			rs[17].GetBatch().SrcRegionId = ""
			rs[40].TimeoutMs = 1 << 40
			rs[41] = &b2bv1.StartTransferRequest{}
			rs[42].GetBatch().Descriptors.BlockLength = 1 << 20
			return rs
		}, map[int]struct {
			code codes.Code
			text string
		}{
			17: {codes.InvalidArgument, "requests[17]: " + "invalid argument: src_region_id is empty"},
			40: {codes.InvalidArgument, "requests[40]: invalid argument: timeout_ms is 1099511627776, over the limit of 3600000"},
			41: {codes.InvalidArgument, "requests[41]: invalid argument: transfer is not set"},
			42: {codes.InvalidArgument, "requests[42]: "},
		}},
		{"the per-client bound refuses requests past it, by index", 3, func(r *manyRig) []*b2bv1.StartTransferRequest {
			return []*b2bv1.StartTransferRequest{r.block(0), r.block(1), r.block(2), r.block(3), r.block(4)}
		}, map[int]struct {
			code codes.Code
			text string
		}{
			3: {codes.ResourceExhausted, "requests[3]: resource exhausted: this client holds 3 transfers"},
			4: {codes.ResourceExhausted, "requests[4]: resource exhausted: this client holds 3 transfers"},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newManyRig(t, c.max)
			reqs := c.reqs(r)
			resp, err := r.a.api.StartTransfers(ctx, &b2bv1.StartTransfersRequest{Requests: reqs})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetResults()) != len(reqs) {
				t.Fatalf("%d results for %d requests", len(resp.GetResults()), len(reqs))
			}
			var ids []uint64
			var good []int
			for i, res := range resp.GetResults() {
				want, isBad := c.bad[i]
				switch {
				case isBad && (codes.Code(res.GetCode()) != want.code || !strings.HasPrefix(res.GetMessage(), want.text) || res.GetTransferId() != 0):
					t.Errorf("requests[%d]: %v %q id %d, want %v %q", i, codes.Code(res.GetCode()), res.GetMessage(), res.GetTransferId(), want.code, want.text)
				case !isBad && (res.GetCode() != 0 || res.GetTransferId() == 0):
					t.Errorf("requests[%d]: %v %q, want a transfer id", i, codes.Code(res.GetCode()), res.GetMessage())
				case !isBad:
					ids, good = append(ids, res.GetTransferId()), append(good, i)
				}
			}
			w, err := r.a.api.WaitTransfers(ctx, &b2bv1.WaitTransfersRequest{TransferIds: ids})
			if err != nil {
				t.Fatal(err)
			}
			for k, o := range w.GetOutcomes() {
				if o.GetState() != b2bv1.TransferState_TRANSFER_STATE_DONE || o.GetTransferId() != ids[k] || o.GetResult().GetBlocks() != 1 {
					t.Fatalf("outcome %d: %v, want transfer %d DONE with 1 block", k, o, ids[k])
				}
			}
			// Every started block landed; no refused one did (the
			// destination starts zeroed).
			if !bytes.Equal(digests(t, r.a.api, r.src, good), digests(t, r.b.api, r.dstID, good)) {
				t.Fatal("the landed blocks differ from their sources")
			}
			for i := range c.bad {
				if bytes.Equal(digests(t, r.a.api, r.src, []int{i}), digests(t, r.b.api, r.dstID, []int{i})) {
					t.Fatalf("refused requests[%d] landed", i)
				}
			}
		})
	}
}

func TestStartTransfersLimit(t *testing.T) {
	r := newManyRig(t, 0)
	reqs := make([]*b2bv1.StartTransferRequest, server.MaxStartTransfers+1)
	for i := range reqs {
		reqs[i] = r.block(0)
	}
	_, err := r.a.api.StartTransfers(context.Background(), &b2bv1.StartTransfersRequest{Requests: reqs})
	wantStatus(t, err, codes.InvalidArgument, fmt.Sprintf("requests has %d transfers, over the limit of %d", len(reqs), server.MaxStartTransfers))
	if st := statusOf(t, r.a.api); st.GetTransfersHeld() != 0 {
		t.Fatalf("a refused call started %d transfers", st.GetTransfersHeld())
	}
}

func TestWaitTransfers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	running, done := b2bv1.TransferState_TRANSFER_STATE_RUNNING, b2bv1.TransferState_TRANSFER_STATE_DONE
	t.Run("any returns once one ended; all waits for the timeout", func(t *testing.T) {
		r := newManyRig(t, 0)
		hang := r.hang(t, r.a.api)
		s, err := r.a.api.StartTransfer(ctx, r.block(3))
		if err != nil {
			t.Fatal(err)
		}
		ids := []uint64{hang, s.GetTransferId()}
		w, err := r.a.api.WaitTransfers(ctx, &b2bv1.WaitTransfersRequest{TransferIds: ids, Any: true})
		if err != nil {
			t.Fatal(err)
		}
		if o := w.GetOutcomes(); len(o) != 2 || o[0].GetState() != running || o[1].GetState() != done {
			t.Fatalf("any: %v, want RUNNING, DONE", o)
		}
		// The done one was reported: it is unknown now, and the call with
		// it is refused whole.
		_, err = r.a.api.WaitTransfers(ctx, &b2bv1.WaitTransfersRequest{TransferIds: ids})
		wantStatus(t, err, codes.NotFound, "transfer_ids[1]")
		begin := time.Now()
		w, err = r.a.api.WaitTransfers(ctx, &b2bv1.WaitTransfersRequest{TransferIds: ids[:1], TimeoutMs: 30})
		if err != nil || w.GetOutcomes()[0].GetState() != running {
			t.Fatalf("all, timed out: %v, %v; want RUNNING", w, err)
		}
		if took := time.Since(begin); took < 30*time.Millisecond {
			t.Fatalf("a wait of 30 ms returned after %v", took)
		}
		_, err = r.a.api.WaitTransfers(ctx, &b2bv1.WaitTransfersRequest{TransferIds: []uint64{hang, hang}})
		wantStatus(t, err, codes.InvalidArgument, "transfer_ids[1] = ")
	})
}

// FuzzStartTransfers feeds any StartTransfersRequest: the call is refused
// whole only over the count limit; otherwise every request has exactly
// one answer, an id or a code with a message naming its index.
func FuzzStartTransfers(f *testing.F) {
	// "SRC" stands for the rig's source region.
	good := (&manyRig{asyncRig: &asyncRig{src: "SRC"}}).block(0)
	seed := []*b2bv1.StartTransfersRequest{
		{Requests: []*b2bv1.StartTransferRequest{good, {}, {TimeoutMs: 1 << 40}}},
		{Requests: []*b2bv1.StartTransferRequest{{Transfer: &b2bv1.StartTransferRequest_Submit{Submit: &b2bv1.SubmitTransferRequest{Handle: 9}}}}},
		{Requests: []*b2bv1.StartTransferRequest{{Transfer: &b2bv1.StartTransferRequest_Blocks{Blocks: &b2bv1.TransferBlocksRequest{LocalLayout: "x", LocalIds: []byte{1, 2, 3}}}}}},
		{Requests: []*b2bv1.StartTransferRequest{{After: &b2bv1.TransferTrigger{CounterRegionId: "SRC", CounterOffset: 3}}}},
	}
	for _, s := range seed {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req b2bv1.StartTransfersRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		r := newManyRig(t, 0)
		for _, q := range req.GetRequests() {
			if q.GetBatch().GetSrcRegionId() == "SRC" {
				q.GetBatch().SrcRegionId = r.src
			}
			if q.GetAfter().GetCounterRegionId() == "SRC" {
				q.GetAfter().CounterRegionId = r.src
			}
		}
		ctx := context.Background()
		resp, err := r.a.api.StartTransfers(ctx, &req)
		if len(req.GetRequests()) > server.MaxStartTransfers {
			wantStatus(t, err, codes.InvalidArgument, "over the limit of")
			return
		}
		if err != nil || len(resp.GetResults()) != len(req.GetRequests()) {
			t.Fatalf("%d requests: %v, %v", len(req.GetRequests()), resp, err)
		}
		for i, res := range resp.GetResults() {
			if (res.GetCode() == 0) == (res.GetTransferId() == 0) {
				t.Fatalf("requests[%d]: id %d with code %d", i, res.GetTransferId(), res.GetCode())
			}
			if res.GetCode() != 0 && !strings.HasPrefix(res.GetMessage(), fmt.Sprintf("requests[%d]: ", i)) {
				t.Fatalf("requests[%d]: message %q does not name its index", i, res.GetMessage())
			}
			if res.GetTransferId() != 0 {
				_, _ = r.a.api.CancelTransfer(ctx, &b2bv1.CancelTransferRequest{TransferId: res.GetTransferId()})
			}
		}
	})
}
