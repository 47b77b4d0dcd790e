package client

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// manyDaemon answers StartTransfers (refusing requests whose timeout_ms
// is 7, as the daemon names them) and WaitTransfers (every id DONE), and
// counts the calls.
type manyDaemon struct {
	b2bv1.UnimplementedB2BServer
	mu     sync.Mutex
	starts []int // requests per StartTransfers call
	waits  [][]uint64
	next   uint64
	// failCall: the StartTransfers call (1-based) that fails whole, as a
	// call over the daemon's message limit does; 0: none.
	failCall  int
	cancelled []uint64
}

func (f *manyDaemon) CancelTransfer(_ context.Context, req *b2bv1.CancelTransferRequest) (*b2bv1.TransferOutcome, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cancelled = append(f.cancelled, req.GetTransferId())
	return &b2bv1.TransferOutcome{TransferId: req.GetTransferId(), State: b2bv1.TransferState_TRANSFER_STATE_CANCELLED, Code: uint32(codes.Canceled)}, nil
}

func (f *manyDaemon) StartTransfers(_ context.Context, req *b2bv1.StartTransfersRequest) (*b2bv1.StartTransfersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts = append(f.starts, len(req.GetRequests()))
	if len(f.starts) == f.failCall {
		return nil, status.Error(codes.ResourceExhausted, "grpc: received message larger than max")
	}
	resp := &b2bv1.StartTransfersResponse{}
	for i, r := range req.GetRequests() {
		if r.GetTimeoutMs() == 7 {
			resp.Results = append(resp.Results, &b2bv1.StartTransferResult{Code: uint32(codes.InvalidArgument), Message: fmt.Sprintf("requests[%d]: bad", i)})
			continue
		}
		f.next++
		resp.Results = append(resp.Results, &b2bv1.StartTransferResult{TransferId: f.next})
	}
	return resp, nil
}

func (f *manyDaemon) WaitTransfers(_ context.Context, req *b2bv1.WaitTransfersRequest) (*b2bv1.PollTransfersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.waits = append(f.waits, req.GetTransferIds())
	resp := &b2bv1.PollTransfersResponse{}
	for _, id := range req.GetTransferIds() {
		resp.Outcomes = append(resp.Outcomes, &b2bv1.TransferOutcome{TransferId: id, State: b2bv1.TransferState_TRANSFER_STATE_DONE, Result: &b2bv1.BatchTransferResponse{Blocks: id}})
	}
	return resp, nil
}

func TestStartManyWaitMany(t *testing.T) {
	cases := []struct {
		name       string
		n          int
		bad        map[int]bool
		wantStarts []int
	}{
		{"64 in one call", 64, nil, []int{64}},
		{"a refused one keeps its index", 8, map[int]bool{3: true}, []int{8}},
		{"over the limit: split", MaxStartTransfers + 5, map[int]bool{MaxStartTransfers + 1: true}, []int{MaxStartTransfers, 5}},
		{"split: refusals in both calls", 2*MaxStartTransfers + 3, map[int]bool{0: true, MaxStartTransfers - 1: true, MaxStartTransfers: true, 2*MaxStartTransfers + 2: true}, []int{MaxStartTransfers, MaxStartTransfers, 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := &manyDaemon{}
			ln := bufconn.Listen(1 << 20)
			gs := grpc.NewServer()
			b2bv1.RegisterB2BServer(gs, f)
			go gs.Serve(ln)
			cl, err := Dial("passthrough:///fake", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { cl.Close(); gs.Stop() }()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			reqs := make([]*b2bv1.StartTransferRequest, c.n)
			for i := range reqs {
				timeout := time.Second
				if c.bad[i] {
					timeout = 7 * time.Millisecond
				}
				reqs[i] = BlocksStart(Blocks{LocalLayout: "l", Peer: "p", RemoteLayout: "r"}, timeout)
			}
			got, err := cl.StartMany(ctx, reqs...)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(f.starts) != fmt.Sprint(c.wantStarts) {
				t.Fatalf("calls of %v requests, want %v", f.starts, c.wantStarts)
			}
			var hs []*TransferHandle
			for i, s := range got {
				if c.bad[i] != (s.Err != nil) || (s.Err == nil) == (s.Handle == nil) {
					t.Fatalf("[%d]: %+v, bad %v", i, s, c.bad[i])
				}
				if s.Err != nil {
					// The message names the caller's index, also past the
					// first call of a split list.
					if status.Code(s.Err) != codes.InvalidArgument || status.Convert(s.Err).Message() != fmt.Sprintf("requests[%d]: bad", i) {
						t.Fatalf("[%d]: %v", i, s.Err)
					}
					continue
				}
				hs = append(hs, s.Handle)
			}
			os, err := cl.WaitMany(ctx, hs, time.Second, false)
			if err != nil || len(f.waits) != 1 || len(f.waits[0]) != len(hs) {
				t.Fatalf("wait: %v; calls %v", err, f.waits)
			}
			for i, h := range hs {
				if r, err := h.Result(); err != nil || r.GetBlocks() != h.ID() || os[i].GetTransferId() != h.ID() {
					t.Fatalf("handle %d: %v, %v", h.ID(), r, err)
				}
			}
			// Ended handles answer from what they hold: no call.
			if _, err := cl.WaitMany(ctx, hs, 0, true); err != nil || len(f.waits) != 1 {
				t.Fatalf("second wait: %v, %d calls", err, len(f.waits))
			}
		})
	}
}

// TestStartManySplitFails: when a later call of a split list fails whole,
// StartMany answers the error and cancels what the earlier calls started,
// so that no transfer runs without a handle.
func TestStartManySplitFails(t *testing.T) {
	for _, tc := range []struct {
		name       string
		n, fail    int
		bad        map[int]bool
		wantCancel int
	}{
		{"first call fails: nothing started", MaxStartTransfers + 3, 1, nil, 0},
		{"second call fails: the first's are cancelled", MaxStartTransfers + 3, 2, map[int]bool{2: true}, MaxStartTransfers - 1},
		{"third call fails", 2*MaxStartTransfers + 1, 3, nil, 2 * MaxStartTransfers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &manyDaemon{failCall: tc.fail}
			ln := bufconn.Listen(1 << 20)
			gs := grpc.NewServer()
			b2bv1.RegisterB2BServer(gs, f)
			go gs.Serve(ln)
			cl, err := Dial("passthrough:///fake", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { cl.Close(); gs.Stop() }()
			reqs := make([]*b2bv1.StartTransferRequest, tc.n)
			for i := range reqs {
				timeout := time.Second
				if tc.bad[i] {
					timeout = 7 * time.Millisecond
				}
				reqs[i] = BlocksStart(Blocks{LocalLayout: "l", Peer: "p", RemoteLayout: "r"}, timeout)
			}
			got, err := cl.StartMany(context.Background(), reqs...)
			if status.Code(err) != codes.ResourceExhausted || got != nil {
				t.Fatalf("%d results, %v; want none, ResourceExhausted", len(got), err)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.cancelled) != tc.wantCancel || uint64(len(f.cancelled)) != f.next {
				t.Fatalf("%d cancelled of %d started, want %d", len(f.cancelled), f.next, tc.wantCancel)
			}
		})
	}
}

// TestStartManyRefusesNegativeTimeouts: a request built with a negative
// timeout is refused as StartTransfer refuses it, by its index, and not
// sent; the daemon's refusals of the others still name the caller's
// indexes.
func TestStartManyRefusesNegativeTimeouts(t *testing.T) {
	f := &manyDaemon{}
	ln := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	b2bv1.RegisterB2BServer(gs, f)
	go gs.Serve(ln)
	cl, err := Dial("passthrough:///fake", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cl.Close(); gs.Stop() }()
	b := Blocks{LocalLayout: "l", Peer: "p", RemoteLayout: "r"}
	reqs := []*b2bv1.StartTransferRequest{
		BlocksStart(b, time.Second),
		BatchStart(Transfer{}, -5*time.Second),
		BlocksStart(b, 7*time.Millisecond), // the fake daemon refuses it
		SubmitStart(1, -time.Nanosecond),
		BlocksStart(b, -time.Millisecond),
		BlocksStart(b, 0),
	}
	got, err := cl.StartMany(context.Background(), reqs...)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"", "requests[1]: timeout -5s", "requests[2]: bad", "requests[3]: timeout -1ns", "requests[4]: timeout -1ms", ""}
	for i, s := range got {
		if want[i] == "" {
			if s.Err != nil || s.Handle == nil {
				t.Fatalf("[%d]: %v, want a handle", i, s.Err)
			}
			continue
		}
		if status.Code(s.Err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(s.Err).Message(), want[i]) {
			t.Fatalf("[%d]: %v, want InvalidArgument %q...", i, s.Err, want[i])
		}
	}
	if fmt.Sprint(f.starts) != "[3]" {
		t.Fatalf("calls of %v requests, want [3]: the refused ones are not sent", f.starts)
	}
}
