package batch

import (
	"context"
	"testing"
	"time"
)

// TestEarly: a pull from a raw gRPC caller runs pullMargin before the
// handler's deadline; one whose client sent the caller's deadline runs to
// exactly that (or to the handler's less the margin, if sooner); writes
// keep their ctx.
func TestEarly(t *testing.T) {
	base := time.Now().Add(time.Hour)
	handler := func() (context.Context, context.CancelFunc) { return context.WithDeadline(context.Background(), base) }
	for _, tc := range []struct {
		name string
		op   Op
		sent time.Duration // the caller's deadline a client sent, relative to base; 0: none
		want time.Time     // the zero time: no deadline
	}{
		{"raw pull", OpRead, 0, base.Add(-pullMargin)},
		{"raw write", OpWrite, 0, base},
		{"client pull", OpRead, -5 * time.Second, base.Add(-5 * time.Second)},
		{"client write", OpWrite, -5 * time.Second, base.Add(-5 * time.Second)},
		{"client pull past the handler's", OpRead, time.Second, base.Add(-pullMargin)},
		{"client pull within the margin", OpRead, -pullMargin / 2, base.Add(-pullMargin)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := handler()
			defer cancel()
			if tc.sent != 0 {
				var c2 context.CancelFunc
				ctx, c2 = CallerDeadline(ctx, base.Add(tc.sent))
				defer c2()
			}
			ctx, c3 := early(ctx, tc.op)
			defer c3()
			if got, _ := ctx.Deadline(); !got.Equal(tc.want) {
				t.Fatalf("deadline %v, want %v (base %v)", got.Sub(base), tc.want.Sub(base), base)
			}
		})
	}
	// A deadline tightened after CallerDeadline is not the caller's: the
	// margin applies again.
	ctx, cancel := handler()
	defer cancel()
	ctx, c2 := CallerDeadline(ctx, base.Add(-time.Minute))
	defer c2()
	ctx, c3 := context.WithDeadline(ctx, base.Add(-2*time.Minute))
	defer c3()
	ctx, c4 := early(ctx, OpRead)
	defer c4()
	if got, _ := ctx.Deadline(); !got.Equal(base.Add(-2*time.Minute - pullMargin)) {
		t.Fatalf("tightened: deadline %v, want %v", got.Sub(base), -2*time.Minute-pullMargin)
	}
}
