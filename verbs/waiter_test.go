//go:build linux

package verbs

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestWaiter(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	w, err := NewWaiter(p[0], -1)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	start := time.Now()
	if r, err := w.Wait(30 * time.Millisecond); err != nil || r != 0 {
		t.Fatalf("timeout: %d %v", r, err)
	}
	if el := time.Since(start); el < 25*time.Millisecond {
		t.Fatalf("returned after %v", el)
	}
	go func() { time.Sleep(10 * time.Millisecond); w.Wake() }()
	if r, err := w.Wait(5 * time.Second); err != nil || r&ReadyWake == 0 {
		t.Fatalf("wake: %d %v", r, err)
	}
	unix.Write(p[1], []byte{1})
	if r, err := w.Wait(5 * time.Second); err != nil || r&ReadyCQ == 0 {
		t.Fatalf("fd: %d %v", r, err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}
