package peer

import (
	"context"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/transport"
)

// TestBrokenDoesNotWait: a batch reporting a broken connection while
// another call holds the peer's lock (a handshake with a frozen peer) is
// not held up; the connection is dropped once the lock is free.
func TestBrokenDoesNotWait(t *testing.T) {
	m, _, _ := newTestManager(t)
	const addr = "127.0.0.1:7470"
	s, err := m.Get(context.Background(), addr, transport.TCP, writeNeed)
	if err != nil {
		t.Fatal(err)
	}
	st := m.kept.lookup(addr)
	st.mu.Lock() // another call's handshake
	done := make(chan struct{})
	go func() { m.Broken(addr, s); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Broken waited for the peer's lock")
	}
	st.mu.Unlock()
	closed := s.Conn.(*trackedConn).Conn.(*fakeConn).closed.Load
	for end := time.Now().Add(5 * time.Second); !closed(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the broken connection was not closed once the lock was free")
		}
	}
}

// TestForgetDoesNotWait: dropping a stale resolution (a refused key, a
// prepared plan's re-bind) while another call holds the peer's lock over a
// handshake with a frozen peer returns at once, and the entry is gone.
func TestForgetDoesNotWait(t *testing.T) {
	m, _, _ := newTestManager(t)
	const addr = "127.0.0.1:7470"
	if _, err := m.Get(context.Background(), addr, transport.TCP, writeNeed); err != nil {
		t.Fatal(err)
	}
	st := m.kept.lookup(addr)
	st.cacheMu.Lock()
	st.resolved[cacheKey("r", transport.AccessWrite)] = cacheEntry[Resolved]{at: time.Now()}
	st.layouts[cacheKey("l", transport.AccessRead)] = cacheEntry[*transport.LayoutResolution]{at: time.Now()}
	st.cacheMu.Unlock()
	st.mu.Lock() // another call's handshake
	defer st.mu.Unlock()
	for _, forget := range []struct {
		name string
		call func()
	}{
		{"Forget", func() { m.Forget(addr, "r", transport.AccessWrite) }},
		{"ForgetLayout", func() { m.ForgetLayout(addr, "l", transport.AccessRead) }},
	} {
		done := make(chan struct{})
		go func() { forget.call(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s waited for the peer's lock", forget.name)
		}
	}
	st.cacheMu.Lock()
	defer st.cacheMu.Unlock()
	if len(st.resolved) != 0 || len(st.layouts) != 0 {
		t.Fatalf("entries left after Forget: %d resolutions, %d layouts", len(st.resolved), len(st.layouts))
	}
}
