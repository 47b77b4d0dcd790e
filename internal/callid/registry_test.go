package callid

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

// caller stands for whatever tells callers apart where a Registry is used
// (the server's region.Caller).
type caller struct {
	uid   uint32
	known bool
}

// TestRegistry: the registry of cancellable calls, step by step: a cancel
// reaches the call in flight under the same caller and id only; a cancel
// that comes first is kept for its call; an id in flight is refused a
// second time; remembered cancels are bounded and expire.
func TestRegistry(t *testing.T) {
	alice, bob := caller{1000, true}, caller{1001, true}
	now := time.Now()
	t.Run("cancel in flight", func(t *testing.T) {
		var c Registry[caller]
		ctx, leave, err := c.Begin(context.Background(), alice, "x")
		if err != nil {
			t.Fatal(err)
		}
		if ended, err := c.Cancel(bob, "x", now); ended != nil || err != nil || ctx.Err() != nil {
			t.Fatalf("another caller's cancel: in flight %v, %v, call ctx %v; want it kept apart", ended != nil, err, ctx.Err())
		}
		if ended, err := c.Cancel(alice, "y", now); ended != nil || err != nil || ctx.Err() != nil {
			t.Fatalf("another id's cancel: in flight %v, %v, call ctx %v", ended != nil, err, ctx.Err())
		}
		ended, err := c.Cancel(alice, "x", now)
		if ended == nil || err != nil {
			t.Fatalf("cancel: %v; want the call in flight", err)
		}
		if !errors.Is(context.Cause(ctx), ErrCancelled) {
			t.Fatalf("the call's cause: %v, want %v", context.Cause(ctx), ErrCancelled)
		}
		select {
		case <-ended:
			t.Fatal("the cancel's channel closed before the call returned")
		default:
		}
		leave()
		<-ended // closed once the call returned
	})
	t.Run("cancel first", func(t *testing.T) {
		var c Registry[caller]
		if ended, err := c.Cancel(alice, "early", now); ended != nil || err != nil {
			t.Fatalf("cancel before the call: in flight %v, %v", ended != nil, err)
		}
		ctx, leave, err := c.Begin(context.Background(), alice, "early")
		if err != nil {
			t.Fatal(err)
		}
		leave()
		if !errors.Is(context.Cause(ctx), ErrCancelled) {
			t.Fatalf("a call whose cancel came first runs with cause %v", context.Cause(ctx))
		}
		if len(c.early) != 0 || len(c.live) != 0 {
			t.Fatalf("left behind: %d early, %d live", len(c.early), len(c.live))
		}
	})
	t.Run("id in flight twice", func(t *testing.T) {
		var c Registry[caller]
		_, leave, err := c.Begin(context.Background(), alice, "dup")
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Begin(context.Background(), alice, "dup"); !errors.Is(err, errs.ErrAlreadyExists) {
			t.Fatalf("second call with the id: %v, want AlreadyExists", err)
		}
		if _, l2, err := c.Begin(context.Background(), bob, "dup"); err != nil {
			t.Fatalf("another caller's call with the same id: %v", err)
		} else {
			l2()
		}
		leave()
		if _, l3, err := c.Begin(context.Background(), alice, "dup"); err != nil {
			t.Fatalf("the id after its call left: %v", err)
		} else {
			l3()
		}
	})
	t.Run("bounded", func(t *testing.T) {
		var c Registry[caller]
		for i := range maxEarly {
			if _, err := c.Cancel(alice, strconv.Itoa(i), now); err != nil {
				t.Fatalf("cancel %d: %v", i, err)
			}
		}
		if _, err := c.Cancel(alice, "one-more", now); !errors.Is(err, errs.ErrResourceExhausted) {
			t.Fatalf("cancel %d: %v, want ResourceExhausted", maxEarly+1, err)
		}
		if _, err := c.Cancel(alice, "one-more", now.Add(earlyTTL+time.Second)); err != nil {
			t.Fatalf("after the remembered cancels expired: %v", err)
		}
		if len(c.early) != 1 {
			t.Fatalf("%d remembered after expiry, want 1", len(c.early))
		}
	})
}
