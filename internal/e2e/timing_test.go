package e2e

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/callid"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Tests of a time bound measure it against their own clock, with a margin
// that grows with how late this machine runs a goroutine right now: a CI
// host or a loaded laptop oversleeps by tens of milliseconds, and a bound
// of a few milliseconds measures the scheduler, not the daemon.

const (
	marginFloor  = 50 * time.Millisecond // never less, however quiet the host
	marginFactor = 10                    // times the worst delay measured
	probeSleeps  = 20
)

// schedDelay is the worst oversleep of probeSleeps 1 ms sleeps: how late a
// goroutine that asked to run may run on this machine now.
func schedDelay() time.Duration {
	var worst time.Duration
	for range probeSleeps {
		start := time.Now()
		time.Sleep(time.Millisecond)
		worst = max(worst, time.Since(start)-time.Millisecond)
	}
	return worst
}

// timeMargin is what a test adds to a time bound: marginFactor times the
// worst scheduling delay measured now, at least marginFloor; logged, so a
// failure says what the margin was.
func timeMargin(t *testing.T) time.Duration {
	t.Helper()
	d := schedDelay()
	m := max(marginFloor, marginFactor*d)
	t.Logf("timing margin %v (worst scheduling delay of %d 1 ms sleeps: %v)", m, probeSleeps, d.Round(10*time.Microsecond))
	return m
}

// sendWatch sees each BatchTransfer a watched client sends, after the
// client's own interceptor took it over: a test times a cut from the
// moment the call left, and knows whether the client sent it at all.
type sendWatch struct {
	on atomic.Pointer[func(sent bool)]
}

// dialWatched is a client of the daemon at addr whose BatchTransfers run
// w's hook (set with arm) as they go out, closed when t ends.
func dialWatched(t *testing.T, addr string, opts ...grpc.DialOption) (*client.Client, *sendWatch) {
	t.Helper()
	w := &sendWatch{}
	c, err := client.Dial(addr, append(opts, grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
		if f := w.on.Load(); f != nil && method == b2bv1.B2B_BatchTransfer_FullMethodName {
			// The client gives a call it takes over (to answer with the
			// daemon's word) a call id; one whose caller had already
			// cut it when it came goes as it was, and is answered by gRPC.
			md, _ := metadata.FromOutgoingContext(ctx)
			(*f)(len(md.Get(callid.Key)) == 1)
		}
		return invoker(ctx, method, req, reply, cc, o...)
	}))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, w
}

// cut runs call under a cut d long: its deadline (d from now), or its
// caller's cancel (d after the call went out). sent says whether the client
// sent the call for the daemon to answer; false only when the deadline had
// passed before the call could go: the machine was too slow to create the
// condition, and the answer is the client's own.
func (w *sendWatch) cut(ctx context.Context, how pullCut, d time.Duration, call func(context.Context) error) (sent bool, err error) {
	var cctx context.Context
	var cancel context.CancelFunc
	if how.code == deadlineCut.code {
		cctx, cancel = context.WithTimeout(ctx, d)
	} else {
		cctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	var timer atomic.Pointer[time.Timer]
	hook := func(s bool) {
		sent = s
		if how.code != deadlineCut.code {
			timer.Store(time.AfterFunc(d, cancel))
		}
	}
	w.on.Store(&hook)
	defer w.on.Store(nil)
	err = call(cctx)
	if tm := timer.Load(); tm != nil {
		tm.Stop()
	}
	return sent, err
}
