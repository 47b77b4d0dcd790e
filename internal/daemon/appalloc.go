package daemon

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/errs"
)

// A calibration's batch between two GPUs must take the path an
// application's batch takes. An application's GPU memory reaches the
// daemon as an IPC handle, which the same-host path opens again in the
// source GPU's context, where copies queued in parts scale; the daemon's
// own allocation cannot be opened so (CUDA refuses a process's own
// handles) and is reached by peer access, where they do not (10,000 x
// 128 B GPU0 -> GPU1: 5.1 against 11.6 ms, deploy/gpu/peerprobe.cu). So
// the destination of that route is allocated by a helper process, this
// binary run as AppAllocCommand, as an application's would be.

// AppAllocCommand is the hidden b2bd command that stands for an
// application during a calibration (ServeAppAlloc).
const AppAllocCommand = "calibration-alloc"

// appAllocWait bounds the helper's start (its CUDA context included).
const appAllocWait = 10 * time.Second

// ServeAppAlloc allocates size bytes on device dev, writes the
// allocation's IPC handle to out (hex, one line) and keeps it until in
// ends (the daemon closed its end, or is gone), then frees it.
func ServeAppAlloc(cu gpudirect.Interface, dev int, size uint64, in io.Reader, out io.Writer) error {
	p, err := cu.MemAlloc(dev, size)
	if err != nil {
		return fmt.Errorf("calibration helper: allocate %d bytes on device %d: %w", size, dev, err)
	}
	h, err := cu.IPCGetMemHandle(dev, p)
	if err == nil {
		_, err = fmt.Fprintln(out, hex.EncodeToString(h[:]))
	}
	if err == nil {
		_, _ = io.Copy(io.Discard, in)
	}
	return errors.Join(err, cu.MemFree(dev, p))
}

// appAllocCmd is the helper's command line (tests replace it).
var appAllocCmd = func(ctx context.Context, dev int, size uint64) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this binary: %w", err)
	}
	return exec.CommandContext(ctx, exe, AppAllocCommand, "--device", strconv.Itoa(dev), "--size", strconv.FormatUint(size, 10)), nil
}

// appAlloc starts the helper and returns the IPC handle of its allocation
// of size bytes on dev, and stop, which lets the helper free it and waits
// for it (call it once the region is deregistered).
func appAlloc(ctx context.Context, dev int, size uint64) (gpudirect.IPCHandle, func(), error) {
	var h gpudirect.IPCHandle
	cmd, err := appAllocCmd(ctx, dev, size)
	if err != nil {
		return h, nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return h, nil, fmt.Errorf("calibration helper: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return h, nil, fmt.Errorf("calibration helper: %w", err)
	}
	var stderr strings.Builder
	cmd.Stderr = &limitWriter{w: &stderr, n: 4096}
	cmd.WaitDelay = time.Second // a killed helper's pipes are not waited for beyond that
	if err := cmd.Start(); err != nil {
		return h, nil, fmt.Errorf("calibration helper: start %s: %w", cmd.Path, err)
	}
	waited := make(chan error, 1)
	stop := func() {
		_ = stdin.Close()
		go func() { waited <- cmd.Wait() }()
		select {
		case <-waited:
		case <-time.After(appAllocWait):
			_ = cmd.Process.Kill()
			<-waited
		}
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
	}()
	var got string
	select {
	case got = <-line:
	case <-time.After(appAllocWait):
		stop()
		return h, nil, fmt.Errorf("%w: calibration helper: no IPC handle within %s", errs.ErrUnavailable, appAllocWait)
	case <-ctx.Done():
		stop()
		return h, nil, ctx.Err()
	}
	b, err := hex.DecodeString(strings.TrimSpace(got))
	if err != nil || len(b) != len(h) {
		stop()
		return h, nil, fmt.Errorf("calibration helper: want a %d-byte IPC handle in hex, got %q (stderr: %s)", len(h), strings.TrimSpace(got), strings.TrimSpace(stderr.String()))
	}
	copy(h[:], b)
	return h, stop, nil
}

// limitWriter keeps the first n bytes written to it.
type limitWriter struct {
	w io.Writer
	n int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		_, _ = l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}
