package trigger

// Stopped returns the channel closed when the watcher's latest goroutine
// has exited (nil if none ever ran).
func (w *Watcher) Stopped() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}

var ParseLoadavg = parseLoadavg
