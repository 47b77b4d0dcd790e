package peer

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestCtxMutex(t *testing.T) {
	var m ctxMutex
	if !m.TryLock() {
		t.Fatal("a zero ctxMutex is not free")
	}
	if m.TryLock() {
		t.Fatal("TryLock took a held lock")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := m.LockContext(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LockContext of a held lock past its deadline: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- m.LockContext(context.Background()) }()
	m.Unlock()
	if err := <-got; err != nil {
		t.Fatalf("LockContext once the lock was let go: %v", err)
	}
	m.Unlock()
	m.Lock()
	m.Unlock()
}
