package client

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/b2bd/b2bd/internal/callerdeadline"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// seen is what the fake daemon saw of one call as it arrived.
type seen struct {
	timeoutMs []string  // the b2b-timeout-ms metadata
	deadline  time.Time // the handler's (gRPC) deadline; zero: none
}

// fakeDaemon tells of each call's arrival, holds BatchTransfer until the
// caller's ctx is done (callerDone) or its own ends, tells how its own ctx
// stood then (ended), and answers with its own status.
type fakeDaemon struct {
	b2bv1.UnimplementedB2BServer
	arrived    chan seen
	ended      chan error
	callerDone chan struct{}
}

func arrival(ctx context.Context) seen {
	md, _ := metadata.FromIncomingContext(ctx)
	s := seen{timeoutMs: md.Get(callerdeadline.Key)}
	s.deadline, _ = ctx.Deadline()
	return s
}

func (f *fakeDaemon) BatchTransfer(ctx context.Context, _ *b2bv1.BatchTransferRequest) (*b2bv1.BatchTransferResponse, error) {
	f.arrived <- arrival(ctx)
	select {
	case <-f.callerDone:
	case <-ctx.Done():
	}
	f.ended <- ctx.Err()
	return nil, status.Error(codes.DeadlineExceeded, "fake daemon: the caller's deadline passed")
}

func (f *fakeDaemon) Status(ctx context.Context, _ *b2bv1.StatusRequest) (*b2bv1.StatusResponse, error) {
	f.arrived <- arrival(ctx)
	return &b2bv1.StatusResponse{}, nil
}

func fakeClient(t *testing.T) (*Client, *fakeDaemon) {
	t.Helper()
	f := &fakeDaemon{arrived: make(chan seen, 1), ended: make(chan error, 1), callerDone: make(chan struct{}, 1)}
	ln := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	b2bv1.RegisterB2BServer(gs, f)
	go gs.Serve(ln)
	c, err := Dial("passthrough:///fake", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); gs.Stop() })
	return c, f
}

// TestCallerDeadline: a transfer's caller deadline goes to the daemon in
// b2b-timeout-ms and the gRPC call's deadline is Grace later, so the answer
// at the caller's deadline is the daemon's; the caller's cancel still
// cancels the call; a call without a deadline, or one that moves no bytes,
// sends no metadata.
func TestCallerDeadline(t *testing.T) {
	c, f := fakeClient(t)
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		d, _ := ctx.Deadline()
		stop := context.AfterFunc(ctx, func() { f.callerDone <- struct{}{} })
		defer stop()
		_, err := c.BatchTransfer(ctx, Transfer{})
		s, ended := <-f.arrived, <-f.ended
		if st := status.Convert(err); st.Code() != codes.DeadlineExceeded || st.Message() != "fake daemon: the caller's deadline passed" {
			t.Fatalf("got %v %q; want the fake daemon's answer", st.Code(), st.Message())
		}
		if ended != nil {
			t.Fatalf("the call ended with the caller's deadline (%v): the daemon could not answer after its data path stopped", ended)
		}
		if len(s.timeoutMs) != 1 {
			t.Fatalf("%s = %q, want one value", callerdeadline.Key, s.timeoutMs)
		}
		ms, err := strconv.Atoi(s.timeoutMs[0])
		if err != nil || ms < 1 || ms > 200 {
			t.Fatalf("%s = %q, want 1 to 200 ms", callerdeadline.Key, s.timeoutMs[0])
		}
		// The call's deadline travels as a relative timeout too: Grace
		// later, give or take its trip.
		if want := d.Add(callerdeadline.Grace); s.deadline.Before(want.Add(-time.Second)) || s.deadline.After(want.Add(time.Second)) {
			t.Fatalf("the call's deadline is %v after the caller's, want about %v", s.deadline.Sub(d), callerdeadline.Grace)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done := make(chan error, 1)
		go func() { _, err := c.BatchTransfer(ctx, Transfer{}); done <- err }()
		<-f.arrived
		cancel()
		if err := <-done; status.Code(err) != codes.Canceled {
			t.Fatalf("got %v, want Canceled", err)
		}
		if ended := <-f.ended; ended != context.Canceled {
			t.Fatalf("the daemon's ctx: %v, want canceled", ended)
		}
	})
	t.Run("no deadline", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := c.BatchTransfer(ctx, Transfer{}); done <- err }()
		s := <-f.arrived
		cancel()
		<-f.ended
		<-done
		if len(s.timeoutMs) != 0 || !s.deadline.IsZero() {
			t.Fatalf("%s = %q, deadline %v; want neither", callerdeadline.Key, s.timeoutMs, s.deadline)
		}
	})
	t.Run("not a transfer", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := c.Status(ctx); err != nil {
			t.Fatal(err)
		}
		if s := <-f.arrived; len(s.timeoutMs) != 0 {
			t.Fatalf("Status sent %s = %q", callerdeadline.Key, s.timeoutMs)
		}
	})
}
