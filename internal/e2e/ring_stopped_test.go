package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/callerdeadline"
)

// TestRingCallsOfAStoppedDaemon: with the client's own daemon stopped
// (SIGSTOP), a ring call with a deadline ends DeadlineExceeded once the
// deadline and callerdeadline.Grace passed, as a gRPC transfer call does;
// it waited for ever before (still blocked 20 s after a 1 s deadline).
// Once the daemon runs again, the ring serves the next call.
func TestRingCallsOfAStoppedDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("starts daemon processes")
	}
	bin := buildDaemon(t)
	a, b := startFrozenProc(t, bin, "a", "tcp"), startFrozenProc(t, bin, "b", "tcp")
	ca, cb := dialSock(t, a.sock), dialSock(t, b.sock)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const blk = 4096
	if _, err := cb.RegisterHost(ctx, 16*blk, "stopped"); err != nil {
		t.Fatal(err)
	}
	src, err := ca.RegisterHost(ctx, 16*blk, "")
	if err != nil {
		t.Fatal(err)
	}
	tr := client.Transfer{SrcRegion: src.Id, Peer: b.peer, DstRegion: "stopped", Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: blk}}
	plan, err := ca.Prepare(ctx, tr)
	if err != nil {
		t.Fatal(err)
	}
	r, err := client.DialRing(a.submit)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Submit(plan); err != nil {
		t.Fatal(err)
	}
	const deadline = 300 * time.Millisecond
	for _, call := range []struct {
		name   string
		cancel bool // the caller cancels at deadline (its ctx has none)
		run    func(ctx context.Context) error
	}{
		{"SubmitContext", false, func(ctx context.Context) error { _, err := r.SubmitContext(ctx, plan); return err }},
		{"TransferRing", false, func(ctx context.Context) error { _, err := ca.TransferRing(ctx, r, tr); return err }},
		// The cancel goes through the ring; a stopped daemon takes it no
		// more than the record: the call gives up the grace later.
		{"SubmitContext cancelled", true, func(ctx context.Context) error { _, err := r.SubmitContext(ctx, plan); return err }},
	} {
		t.Run(call.name, func(t *testing.T) {
			if err := stopProc(a); err != nil {
				t.Fatal(err)
			}
			defer a.cmd.Process.Signal(syscall.SIGCONT)
			cctx, ccancel := context.WithTimeout(ctx, deadline)
			want := codes.DeadlineExceeded
			if call.cancel {
				cctx, ccancel = context.WithCancel(ctx)
				time.AfterFunc(deadline, ccancel)
				want = codes.Canceled
			}
			defer ccancel()
			errc := make(chan error, 1)
			t0 := time.Now()
			go func() { errc <- call.run(cctx) }()
			limit := deadline + callerdeadline.Grace + 5*time.Second
			select {
			case err := <-errc:
				if status.Code(err) != want {
					t.Fatalf("%s with its daemon stopped: %v, want %v", call.name, err, want)
				}
				if took := time.Since(t0); took < deadline+callerdeadline.Grace-100*time.Millisecond {
					t.Fatalf("%s answered after %v, before its deadline and the grace", call.name, took)
				}
			case <-time.After(limit):
				t.Fatalf("%s with its daemon stopped: still blocked %v after its %v deadline", call.name, limit, deadline)
			}
			if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Submit(plan); err != nil {
				t.Fatalf("the ring after the daemon went on: %v", err)
			}
		})
	}
}
