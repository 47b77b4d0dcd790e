//go:build !linux

package verbs

import "time"

// Readiness bits returned by Waiter.Wait.
const (
	ReadyCQ    = 1
	ReadyAsync = 2
	ReadyWake  = 4
)

// Waiter is Linux-only.
type Waiter struct{}

// NewWaiter is unavailable off Linux.
func NewWaiter(compFD, asyncFD int) (*Waiter, error)      { return nil, errUnavailable }
func (w *Waiter) Wait(timeout time.Duration) (int, error) { return 0, errUnavailable }
func (w *Waiter) Wake()                                   {}
func (w *Waiter) Close() error                            { return nil }
