package gpudirect

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

func addFn(r *request) { r.out0 = r.a0 + r.a1 }

func TestWorkerRunsRequests(t *testing.T) {
	var inits, finis atomic.Int32
	w, err := startWorker("test", func() error { inits.Add(1); return nil }, func() error { finis.Add(1); return nil })
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ a, b, want uint64 }{{1, 2, 3}, {0, 0, 0}, {1 << 40, 5, 1<<40 + 5}}
	for _, tt := range tests {
		r := getRequest()
		r.fn, r.a0, r.a1 = addFn, tt.a, tt.b
		if err := w.submit(r); err != nil {
			t.Fatal(err)
		}
		if r.out0 != tt.want {
			t.Errorf("%d+%d = %d", tt.a, tt.b, r.out0)
		}
		putRequest(r)
	}
	// Calls from many goroutines are serialised on the worker.
	var wg sync.WaitGroup
	counter := 0 // touched only on the worker: the race detector checks that
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if err := w.do(func() { counter++ }); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := w.do(func() {
		if counter != 1600 {
			t.Errorf("counter = %d, want 1600", counter)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	if err := w.stop(); err != nil {
		t.Fatal("second stop:", err)
	}
	if inits.Load() != 1 || finis.Load() != 1 {
		t.Fatalf("init ran %d times, fini %d times; want 1 and 1", inits.Load(), finis.Load())
	}
	if err := w.do(func() {}); !errors.Is(err, ErrClosed) || !errors.Is(err, ErrInvalidState) {
		t.Fatalf("do after stop = %v; want ErrClosed", err)
	}
}

func TestWorkerInitAndFiniErrors(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name     string
		init     func() error
		fini     func() error
		startErr error
		stopErr  error
	}{
		{"init fails", func() error { return boom }, nil, boom, nil},
		{"init panics", func() error { panic("init") }, nil, ErrAborted, nil},
		{"fini fails", nil, func() error { return boom }, nil, boom},
		{"fini panics", nil, func() error { panic("fini") }, nil, ErrAborted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := startWorker("test", tt.init, tt.fini)
			if tt.startErr != nil {
				if !errors.Is(err, tt.startErr) || w != nil {
					t.Fatalf("startWorker = %v, %v; want %v", w, err, tt.startErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := w.stop(); !errors.Is(err, tt.stopErr) {
				t.Fatalf("stop = %v; want %v", err, tt.stopErr)
			}
		})
	}
}

func TestWorkerRecoversPanics(t *testing.T) {
	w, err := startWorker("test", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.stop()
	if err := w.do(func() { panic("bug") }); !errors.Is(err, ErrAborted) {
		t.Fatalf("do(panic) = %v; want ErrAborted", err)
	}
	ran := false
	if err := w.do(func() { ran = true }); err != nil || !ran {
		t.Fatalf("worker unusable after a panic: %v", err)
	}
}

func TestWorkerSubmitAllocatesNothing(t *testing.T) {
	w, err := startWorker("test", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.stop()
	call := func() {
		r := getRequest()
		r.fn, r.a0, r.a1 = addFn, 1, 2
		if err := w.submit(r); err != nil || r.out0 != 3 {
			t.Fatal(err, r.out0)
		}
		putRequest(r)
	}
	call() // warm the pool
	if n := testing.AllocsPerRun(1000, call); n != 0 {
		t.Fatalf("submit allocates %.1f times per call; want 0", n)
	}
}

func BenchmarkWorkerSubmit(b *testing.B) {
	w, err := startWorker("bench", nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer w.stop()
	b.ReportAllocs()
	for b.Loop() {
		r := getRequest()
		r.fn, r.a0, r.a1 = addFn, 1, 2
		_ = w.submit(r)
		putRequest(r)
	}
}
