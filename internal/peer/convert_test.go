package peer

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/errs"
)

func TestFromRPC(t *testing.T) {
	live := context.Background()
	expired, cancel := context.WithDeadline(live, time.Now().Add(-time.Second))
	defer cancel()
	reset := status.Error(codes.DeadlineExceeded, "stream terminated by RST_STREAM with error code: CANCEL")
	cases := []struct {
		name string
		ctx  context.Context
		err  error
		want error  // class
		msg  string // text
	}{
		{"nil", live, nil, nil, ""},
		{"peer's class kept", live, status.Error(codes.NotFound, "no region kv"), errs.ErrNotFound, "no region kv"},
		{"live ctx keeps the peer's text", live, reset, context.DeadlineExceeded, reset.(interface{ GRPCStatus() *status.Status }).GRPCStatus().Message()},
		{"our deadline: ctx's error", expired, reset, context.DeadlineExceeded, "context deadline exceeded"},
		{"our deadline, refused: peer's class", expired, status.Error(codes.PermissionDenied, "no"), errs.ErrPermissionDenied, "no"},
		// Nobody cancelled our call: the connection closed under it (another
		// batch broke it), which is a broken connection, not a cancel.
		{"closing connection, live ctx: unavailable", live, status.Error(codes.Canceled, "grpc: the client connection is closing"), errs.ErrUnavailable, "the call was cancelled by the connection or the peer, not by its caller: grpc: the client connection is closing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := fromRPC(c.ctx, c.err)
			if c.err == nil {
				if got != nil {
					t.Fatalf("fromRPC(nil) = %v", got)
				}
				return
			}
			if errs.Class(got) != c.want || got.Error() != c.msg || (c.want == context.DeadlineExceeded && !errors.Is(got, context.DeadlineExceeded)) {
				t.Fatalf("fromRPC = %v (%v), want %q (%v)", got, errs.Class(got), c.msg, c.want)
			}
		})
	}
}
