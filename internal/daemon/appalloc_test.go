package daemon

import (
	"bufio"
	"context"
	"encoding/hex"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/gpudirect/cudatest"
)

// TestServeAppAlloc: the helper writes an IPC handle that opens, holds the
// allocation while its stdin is open, and frees it once stdin ends.
func TestServeAppAlloc(t *testing.T) {
	cu := cudatest.New(cudatest.Device{}, cudatest.Device{})
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- ServeAppAlloc(cu, 1, 1<<20, inR, outW) }()
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	b, err := hex.DecodeString(strings.TrimSpace(line))
	if err != nil || len(b) != gpudirect.IPCHandleSize {
		t.Fatalf("handle line %q: %v", line, err)
	}
	var h gpudirect.IPCHandle
	copy(h[:], b)
	p, err := cu.IPCOpenMemHandle(0, h)
	if err != nil {
		t.Fatalf("the helper's handle does not open: %v", err)
	}
	if err := cu.IPCCloseMemHandle(0, p); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("the helper ended with its stdin open: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	_ = inW.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if l := cu.Leaks(); len(l) > 0 {
		t.Fatalf("left allocated: %v", l)
	}
}

// TestAppAlloc: the daemon's side reads the helper's handle, refuses
// anything else naming what it got, and does not wait out a helper that
// says nothing once its context ends.
func TestAppAlloc(t *testing.T) {
	good := strings.Repeat("ab", gpudirect.IPCHandleSize)
	tests := []struct {
		name, script string
		cancel       bool
		wantErr      string
	}{
		{"handle", "echo " + good + "; cat > /dev/null", false, ""},
		{"not hex", "echo not-a-handle; cat > /dev/null", false, `got "not-a-handle"`},
		{"short", "echo abcd", false, "64-byte IPC handle"},
		{"helper fails", "echo no driver >&2; exit 3", false, "stderr: no driver"},
		{"silent, cancelled", "sleep 30", true, "context canceled"},
	}
	saved := appAllocCmd
	t.Cleanup(func() { appAllocCmd = saved })
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			appAllocCmd = func(ctx context.Context, dev int, size uint64) (*exec.Cmd, error) {
				return exec.CommandContext(ctx, "sh", "-c", tt.script), nil
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancel {
				time.AfterFunc(50*time.Millisecond, cancel)
			}
			t0 := time.Now()
			h, stop, err := appAlloc(ctx, 1, 1<<20)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if hex.EncodeToString(h[:]) != good {
					t.Fatalf("handle %x", h)
				}
				stop()
			} else if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("appAlloc = %v; want an error containing %q", err, tt.wantErr)
			}
			if d := time.Since(t0); d > 5*time.Second {
				t.Fatalf("took %s", d)
			}
		})
	}
}
