package client

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/b2bd/b2bd/internal/callerdeadline"
	"github.com/b2bd/b2bd/internal/callid"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// seen is what the fake daemon saw of one call as it arrived.
type seen struct {
	timeoutMs []string  // the b2b-timeout-ms metadata
	callID    []string  // the b2b-call-id metadata
	deadline  time.Time // the handler's (gRPC) deadline; zero: none
}

// fakeDaemon tells of each call's arrival, holds BatchTransfer until it is
// told the answer (release: the caller's deadline passed, or CancelCall
// came) or its own ctx ends, tells how its own ctx stood then (ended), and
// answers with the status it was told. CancelCall tells the id it got
// (cancelled) and releases the call, unless noCancelCall (a daemon that
// predates it).
type fakeDaemon struct {
	b2bv1.UnimplementedB2BServer
	arrived      chan seen
	ended        chan error
	release      chan error
	cancelled    chan string
	noCancelCall atomic.Bool
}

func arrival(ctx context.Context) seen {
	md, _ := metadata.FromIncomingContext(ctx)
	s := seen{timeoutMs: md.Get(callerdeadline.Key), callID: md.Get(callid.Key)}
	s.deadline, _ = ctx.Deadline()
	return s
}

func (f *fakeDaemon) BatchTransfer(ctx context.Context, _ *b2bv1.BatchTransferRequest) (*b2bv1.BatchTransferResponse, error) {
	f.arrived <- arrival(ctx)
	answer := status.Error(codes.Unavailable, "fake daemon: its own ctx ended")
	select {
	case answer = <-f.release:
	case <-ctx.Done():
	}
	f.ended <- ctx.Err()
	return nil, answer
}

const stoppedByCancelCall = "fake daemon: stopped by CancelCall"

func (f *fakeDaemon) CancelCall(_ context.Context, req *b2bv1.CancelCallRequest) (*b2bv1.CancelCallResponse, error) {
	if f.noCancelCall.Load() {
		return nil, status.Error(codes.Unimplemented, "fake daemon: no CancelCall")
	}
	f.cancelled <- req.GetCallId()
	f.release <- status.Error(codes.Canceled, stoppedByCancelCall)
	return &b2bv1.CancelCallResponse{InFlight: true}, nil
}

func (f *fakeDaemon) Status(ctx context.Context, _ *b2bv1.StatusRequest) (*b2bv1.StatusResponse, error) {
	f.arrived <- arrival(ctx)
	return &b2bv1.StatusResponse{}, nil
}

func fakeClient(t *testing.T) (*Client, *fakeDaemon) {
	t.Helper()
	f := &fakeDaemon{arrived: make(chan seen, 1), ended: make(chan error, 1), release: make(chan error, 1), cancelled: make(chan string, 1)}
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
		stop := context.AfterFunc(ctx, func() { f.release <- status.Error(codes.DeadlineExceeded, "fake daemon: the caller's deadline passed") })
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
		// The cancel goes to the daemon as CancelCall with the call's id,
		// and the call returns the daemon's answer: the call itself was not
		// cancelled (its ctx did not end), so the daemon could answer after
		// its data path stopped.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done := make(chan error, 1)
		go func() { _, err := c.BatchTransfer(ctx, Transfer{}); done <- err }()
		s := <-f.arrived
		cancel()
		if err := <-done; status.Code(err) != codes.Canceled || status.Convert(err).Message() != stoppedByCancelCall {
			t.Fatalf("got %v, want the fake daemon's Canceled %q", err, stoppedByCancelCall)
		}
		if ended := <-f.ended; ended != nil {
			t.Fatalf("the daemon's ctx ended (%v): the caller's cancel cut the call at the client", ended)
		}
		if id := <-f.cancelled; len(s.callID) != 1 || id != s.callID[0] || callid.Check("id", id) != nil {
			t.Fatalf("CancelCall named %q, the call carried %s %q", id, callid.Key, s.callID)
		}
	})
	t.Run("cancel, daemon without CancelCall", func(t *testing.T) {
		f.noCancelCall.Store(true)
		defer f.noCancelCall.Store(false)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := c.BatchTransfer(ctx, Transfer{}); done <- err }()
		<-f.arrived
		cancel()
		if err := <-done; status.Code(err) != codes.Canceled || status.Convert(err).Message() == stoppedByCancelCall {
			t.Fatalf("got %v, want the client's own Canceled", err)
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
		<-f.cancelled
		<-done
		if len(s.timeoutMs) != 0 || !s.deadline.IsZero() {
			t.Fatalf("%s = %q, deadline %v; want neither", callerdeadline.Key, s.timeoutMs, s.deadline)
		}
		if len(s.callID) != 1 {
			t.Fatalf("%s = %q, want one: the caller can cancel", callid.Key, s.callID)
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
