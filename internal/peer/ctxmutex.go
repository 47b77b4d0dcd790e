package peer

import (
	"context"
	"fmt"
	"sync"

	"github.com/b2bd/b2bd/internal/transport"
)

// ctxMutex is a mutex whose Lock can give up when the caller's context
// ends: a peer's lock is held across a handshake or a connect over the
// network, which a frozen peer stretches to its timeouts, and a call with a
// shorter deadline queued behind it must still answer at its own. The zero
// value is an unlocked mutex.
type ctxMutex struct {
	once sync.Once
	ch   chan struct{}
}

func (m *ctxMutex) sem() chan struct{} {
	m.once.Do(func() { m.ch = make(chan struct{}, 1) })
	return m.ch
}

func (m *ctxMutex) Lock()   { m.sem() <- struct{}{} }
func (m *ctxMutex) Unlock() { <-m.sem() }

// TryLock takes the lock if it is free.
func (m *ctxMutex) TryLock() bool {
	select {
	case m.sem() <- struct{}{}:
		return true
	default:
		return false
	}
}

// LockContext takes the lock, or returns ctx's error once ctx ends first.
func (m *ctxMutex) LockContext(ctx context.Context) error {
	select {
	case m.sem() <- struct{}{}:
		return nil
	default:
	}
	select {
	case m.sem() <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// peerBusy is the error of a call whose context ended while it waited for
// the peer's lock, which another call held across a handshake or connect:
// nothing of it was sent.
func peerBusy(addr string, err error) error {
	return fmt.Errorf("%w: peer %s: waiting for another call's handshake or connect: %w", transport.ErrNotSent, addr, err)
}
