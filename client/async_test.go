package client

import (
	"context"
	"errors"
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

// reportOnce is a fake daemon with one transfer (id 1) whose outcome it
// reports once, as the daemon does: WaitTransfer holds until release is
// closed, then hands DONE over even to a caller that went away (the
// daemon's answer may be on the wire when the caller gives up) and forgets
// the id; later Waits, Polls and Cancels of it are NotFound.
type reportOnce struct {
	b2bv1.UnimplementedB2BServer
	arrived, release chan struct{}
	once             sync.Once
	mu               sync.Mutex
	reported         bool
}

const reportOnceBlocks = 7

func (f *reportOnce) report() (*b2bv1.TransferOutcome, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reported {
		return nil, status.Error(codes.NotFound, "transfer_id 1 is unknown (reported already)")
	}
	f.reported = true
	return &b2bv1.TransferOutcome{TransferId: 1, State: b2bv1.TransferState_TRANSFER_STATE_DONE, Result: &b2bv1.BatchTransferResponse{Blocks: reportOnceBlocks}}, nil
}

func (f *reportOnce) WaitTransfer(context.Context, *b2bv1.WaitTransferRequest) (*b2bv1.TransferOutcome, error) {
	f.once.Do(func() { close(f.arrived) })
	<-f.release
	return f.report()
}

func (f *reportOnce) PollTransfers(context.Context, *b2bv1.PollTransfersRequest) (*b2bv1.PollTransfersResponse, error) {
	select {
	case <-f.release:
	default:
		return &b2bv1.PollTransfersResponse{Outcomes: []*b2bv1.TransferOutcome{{TransferId: 1, State: b2bv1.TransferState_TRANSFER_STATE_RUNNING}}}, nil
	}
	o, err := f.report()
	if err != nil {
		return nil, err
	}
	return &b2bv1.PollTransfersResponse{Outcomes: []*b2bv1.TransferOutcome{o}}, nil
}

func (f *reportOnce) CancelTransfer(context.Context, *b2bv1.CancelTransferRequest) (*b2bv1.TransferOutcome, error) {
	return f.report()
}

// TestWaitGivenUpKeepsTheOutcome: a Wait whose ctx ends while the daemon
// is handing the outcome over loses nothing: the next Wait, Poll or Cancel
// of the handle gets it.
func TestWaitGivenUpKeepsTheOutcome(t *testing.T) {
	for _, then := range []string{"wait", "poll", "cancel"} {
		t.Run(then, func(t *testing.T) {
			f := &reportOnce{arrived: make(chan struct{}), release: make(chan struct{})}
			ln := bufconn.Listen(1 << 20)
			gs := grpc.NewServer()
			b2bv1.RegisterB2BServer(gs, f)
			go gs.Serve(ln)
			c, err := Dial("passthrough:///fake", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { c.Close(); gs.Stop() }()
			h := c.Handle(1)
			ctx, cancel := context.WithCancel(context.Background())
			go func() { <-f.arrived; cancel() }()
			if _, err := h.Wait(ctx, 0); !errors.Is(err, context.Canceled) && status.Code(err) != codes.Canceled {
				t.Fatalf("Wait: %v, want the caller's cancel", err)
			}
			close(f.release) // the daemon hands the outcome over now
			bg, stop := context.WithTimeout(context.Background(), 10*time.Second)
			defer stop()
			var o *b2bv1.TransferOutcome
			switch then {
			case "wait":
				o, err = h.Wait(bg, 0)
			case "poll":
				for o == nil || o.GetState() == b2bv1.TransferState_TRANSFER_STATE_RUNNING {
					var os []*b2bv1.TransferOutcome
					if os, err = c.Poll(bg, []*TransferHandle{h}); err != nil {
						break
					}
					o = os[0]
					time.Sleep(time.Millisecond)
				}
			case "cancel":
				o, err = h.Cancel(bg)
			}
			if err != nil {
				t.Fatalf("%s after the given-up wait: %v: the outcome was lost", then, err)
			}
			if r, err := h.Result(); err != nil || r.GetBlocks() != reportOnceBlocks || o.GetResult().GetBlocks() != reportOnceBlocks {
				t.Fatalf("outcome %v, result %v, %v; want DONE with %d blocks", o, r, err, reportOnceBlocks)
			}
		})
	}
}

// TestStartRefusesNegativeTimeout: a negative timeout (of a start or a
// wait) is refused before any call (0 is the daemon's default, or no
// limit for a wait), naming the value.
func TestStartRefusesNegativeTimeout(t *testing.T) {
	c := &Client{} // no connection: a call would panic, a refusal makes none
	ctx := context.Background()
	for name, start := range map[string]func() error{
		"StartTransfer": func() error { _, err := c.StartTransfer(ctx, Transfer{}, -5*time.Second); return err },
		"StartBlocks":   func() error { _, err := c.StartBlocks(ctx, Blocks{}, -time.Millisecond); return err },
		"StartSubmit":   func() error { _, err := c.StartSubmit(ctx, 1, -time.Nanosecond); return err },
		// A wait's timeout alike: negative is not 0 ("until it ends").
		"Wait": func() error { _, err := c.Handle(1).Wait(ctx, -time.Second); return err },
		"WaitMany": func() error {
			_, err := c.WaitMany(ctx, []*TransferHandle{c.Handle(1)}, -time.Second, false)
			return err
		},
	} {
		err := start()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "timeout -") {
			t.Errorf("%s: %v, want InvalidArgument naming the timeout", name, err)
		}
	}
}

// TestWaitManyAnyEndedAlready: with anyOne, a handle that already ended
// answers the wait at once, without a call; the others are RUNNING with
// their ids (as Poll answers), not nil outcomes.
func TestWaitManyAnyEndedAlready(t *testing.T) {
	c := &Client{} // no connection: a call would panic
	done := &TransferHandle{c: c, id: 7, out: &b2bv1.TransferOutcome{TransferId: 7, State: b2bv1.TransferState_TRANSFER_STATE_DONE}}
	hs := []*TransferHandle{c.Handle(5), done, c.Handle(9)}
	os, err := c.WaitMany(context.Background(), hs, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		id    uint64
		state b2bv1.TransferState
	}{{5, b2bv1.TransferState_TRANSFER_STATE_RUNNING}, {7, b2bv1.TransferState_TRANSFER_STATE_DONE}, {9, b2bv1.TransferState_TRANSFER_STATE_RUNNING}} {
		if os[i] == nil || os[i].GetTransferId() != want.id || os[i].GetState() != want.state {
			t.Fatalf("[%d]: %v; want id %d %v", i, os[i], want.id, want.state)
		}
	}
}
