//go:build linux

package gpudirect

import (
	"syscall"
	"testing"
)

// Every call runs on the one OS thread the worker locked (where a device's
// CUDA context is current), whichever goroutine submits it.
func TestWorkerStaysOnOneThread(t *testing.T) {
	var initTid int
	w, err := startWorker("test", func() error { initTid = syscall.Gettid(); return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.stop()
	done := make(chan int, 64)
	for g := 0; g < 64; g++ {
		go func() {
			tid := 0
			if err := w.do(func() { tid = syscall.Gettid() }); err != nil {
				t.Error(err)
			}
			done <- tid
		}()
	}
	for g := 0; g < 64; g++ {
		if tid := <-done; tid != initTid {
			t.Fatalf("call ran on thread %d, init on %d", tid, initTid)
		}
	}
}
