package client

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/callerdeadline"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

func (f *fakeDaemon) hold(ctx context.Context) error {
	f.arrived <- arrival(ctx)
	answer := status.Error(codes.Unavailable, "fake daemon: its own ctx ended")
	select {
	case answer = <-f.release:
	case <-ctx.Done():
	}
	f.ended <- ctx.Err()
	return answer
}

func (f *fakeDaemon) PrepareTransfer(ctx context.Context, _ *b2bv1.PrepareTransferRequest) (*b2bv1.PrepareTransferResponse, error) {
	return nil, f.hold(ctx)
}

func (f *fakeDaemon) WarmTransfer(ctx context.Context, _ *b2bv1.WarmTransferRequest) (*b2bv1.WarmTransferResponse, error) {
	return nil, f.hold(ctx)
}

// TestCallerDeadlineOfPrepareAndWarm: Prepare and Warm reach the peer
// (handshake, resolve, connect) as a transfer does, so a peer that does
// not answer (frozen) holds them to the caller's deadline. Their caller's
// deadline goes to the daemon too, so that the DeadlineExceeded is the
// daemon's, naming the peer and the phase; before, gRPC's own deadline
// answered "context deadline exceeded" (or "stream terminated by
// RST_STREAM"), naming nothing. The caller's cancel still cancels them.
func TestCallerDeadlineOfPrepareAndWarm(t *testing.T) {
	c, f := fakeClient(t)
	const daemonSays = "fake daemon: peer p:1: handshake: the caller's deadline passed"
	for _, tc := range []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Prepare", func(ctx context.Context) error { _, err := c.Prepare(ctx, Transfer{}); return err }},
		{"Warm", func(ctx context.Context) error { _, err := c.Warm(ctx, Transfer{}); return err }},
	} {
		t.Run(tc.name+" deadline", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			d, _ := ctx.Deadline()
			stop := context.AfterFunc(ctx, func() { f.release <- status.Error(codes.DeadlineExceeded, daemonSays) })
			defer stop()
			err := tc.call(ctx)
			s, ended := <-f.arrived, <-f.ended
			if st := status.Convert(err); st.Code() != codes.DeadlineExceeded || st.Message() != daemonSays {
				t.Fatalf("got %v %q; want the daemon's answer %q", st.Code(), st.Message(), daemonSays)
			}
			if ended != nil {
				t.Fatalf("the call ended with the caller's deadline (%v): the daemon could not answer", ended)
			}
			if len(s.timeoutMs) != 1 {
				t.Fatalf("%s = %q, want one value", callerdeadline.Key, s.timeoutMs)
			}
			if ms, err := strconv.Atoi(s.timeoutMs[0]); err != nil || ms < 1 || ms > 200 {
				t.Fatalf("%s = %q, want 1 to 200 ms", callerdeadline.Key, s.timeoutMs[0])
			}
			if want := d.Add(callerdeadline.Grace); s.deadline.Before(want.Add(-time.Second)) || s.deadline.After(want.Add(time.Second)) {
				t.Fatalf("the call's deadline is %v after the caller's, want about %v", s.deadline.Sub(d), callerdeadline.Grace)
			}
		})
		t.Run(tc.name+" cancel", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			done := make(chan error, 1)
			go func() { done <- tc.call(ctx) }()
			<-f.arrived
			t0 := time.Now()
			cancel()
			if err := <-done; status.Code(err) != codes.Canceled {
				t.Fatalf("got %v, want Canceled", err)
			}
			if ended := <-f.ended; ended != context.Canceled {
				t.Fatalf("the daemon's ctx: %v, want canceled", ended)
			}
			if took := time.Since(t0); took > time.Second {
				t.Fatalf("the cancel took %v", took)
			}
		})
	}
}
