package grpcstatus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/errs"
)

// classed is an error outside the table that says it is one of the classes
// through an Is method, as some library errors do.
type classed struct{}

func (classed) Error() string        { return "classed" }
func (classed) Is(target error) bool { return target == errs.ErrResourceExhausted }

func TestCodeOutermostClassWins(t *testing.T) {
	ctxDeadline := context.DeadlineExceeded
	cases := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"nil", nil, codes.OK},
		{"bare sentinel", errs.ErrNotFound, codes.NotFound},
		{"no class", io.ErrUnexpectedEOF, codes.Internal},
		{"one wrap", fmt.Errorf("%w: region r1", errs.ErrFailedPrecondition), codes.FailedPrecondition},
		{"aborted wrapping ctx deadline (multi %w)", fmt.Errorf("%w: tcp: batch 3 cut off: %w", errs.ErrAborted, ctxDeadline), codes.Aborted},
		{"aborted wrapping canceled", fmt.Errorf("%w: verbs: %w", errs.ErrAborted, context.Canceled), codes.Aborted},
		{"deadline wrapping aborted", fmt.Errorf("%w: %w", ctxDeadline, fmt.Errorf("%w: x", errs.ErrAborted)), codes.DeadlineExceeded},
		{"unavailable around not found", fmt.Errorf("%w: dial: %w", errs.ErrUnavailable, fmt.Errorf("%w: y", errs.ErrNotFound)), codes.Unavailable},
		{"context added outside", fmt.Errorf("batch of 3 blocks: %w", fmt.Errorf("%w: dial: %w", errs.ErrUnavailable, os.ErrDeadlineExceeded)), codes.Unavailable},
		{"class at depth 1 beats depth 2 across branches",
			fmt.Errorf("%w / %w", fmt.Errorf("ctx: %w", fmt.Errorf("%w", errs.ErrNotFound)), errs.ErrDataLoss), codes.DataLoss},
		{"left branch first at the same depth", fmt.Errorf("%w and %w", errs.ErrInvalidArgument, errs.ErrAborted), codes.InvalidArgument},
		{"errors.Join", errors.Join(io.EOF, fmt.Errorf("%w: z", errs.ErrPermissionDenied)), codes.PermissionDenied},
		{"Is method", fmt.Errorf("outer: %w", classed{}), codes.ResourceExhausted},
		{"from a peer's status", FromStatus(status.Error(codes.NotFound, "no region kv")), codes.NotFound},
		{"data loss with fault", fmt.Errorf("batch: %w", fmt.Errorf("%w (%w) at 0x1", errors.New("memory fault"), errs.ErrDataLoss)), codes.DataLoss},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Code(c.err); got != c.want {
				t.Fatalf("Code(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}

// lateCtx is a context whose deadline has passed but whose timer has not
// fired yet: Err is still nil, as for a moment after any deadline.
type lateCtx struct{ context.Context }

func (lateCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }
func (lateCtx) Err() error                  { return nil }

func TestForCallerDeadlineOrCancelWins(t *testing.T) {
	expired, cancel1 := context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel1()
	canceled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	live := context.Background()
	dial := fmt.Errorf("%w: tcp: dial data stream 0 to 10.0.0.1:7471: %w", errs.ErrUnavailable, os.ErrDeadlineExceeded)
	cases := []struct {
		name string
		ctx  context.Context
		err  error
		want codes.Code
	}{
		{"live ctx keeps the class", live, dial, codes.Unavailable},
		{"live ctx keeps aborted", live, fmt.Errorf("%w: x: %w", errs.ErrAborted, context.DeadlineExceeded), codes.Aborted},
		{"expired ctx: dial timeout", expired, dial, codes.DeadlineExceeded},
		{"expired ctx: aborted", expired, fmt.Errorf("%w: cut off", errs.ErrAborted), codes.DeadlineExceeded},
		{"expired ctx: already deadline", expired, fmt.Errorf("w: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{"canceled ctx", canceled, dial, codes.Canceled},
		{"deadline passed, timer not fired yet", lateCtx{live}, dial, codes.DeadlineExceeded},
		{"canceled ctx: error says deadline", canceled, fmt.Errorf("w: %w", context.DeadlineExceeded), codes.Canceled},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := ForCaller(c.ctx, c.err)
			if Code(got) != c.want {
				t.Fatalf("Code(ForCaller) = %v (%v), want %v", Code(got), got, c.want)
			}
			if st, _ := status.FromError(ToStatus(got)); st.Code() != c.want {
				t.Fatalf("ToStatus code = %v, want %v", st.Code(), c.want)
			}
			if !errors.Is(got, c.err) {
				t.Fatalf("ForCaller lost the cause: %v", got)
			}
		})
	}
	if ForCaller(expired, nil) != nil {
		t.Fatal("ForCaller(ctx, nil) != nil")
	}
}

func TestClassMatchesCode(t *testing.T) {
	if len(codeMap) != len(errs.Classes) {
		t.Fatalf("%d codes for %d classes", len(codeMap), len(errs.Classes))
	}
	for i, c := range errs.Classes {
		if codeMap[i].err != c {
			t.Fatalf("class %d is %v, code map has %v", i, c, codeMap[i].err)
		}
	}
}

func TestFromStatusNil(t *testing.T) {
	if err := FromStatus(nil); err != nil {
		t.Fatalf("FromStatus(nil) = %v", err)
	}
}
