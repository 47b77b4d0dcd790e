package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// buildDaemon compiles cmd/b2bd for the end-to-end test.
func buildDaemon(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go toolchain to build b2bd with")
	}
	out := filepath.Join(t.TempDir(), "b2bd")
	cmd := exec.Command(goBin, "build", "-o", out, "github.com/b2bd/b2bd/cmd/b2bd")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build b2bd: %v\n%s", err, msg)
	}
	return out
}

// TestRunEmbedded runs a small sweep against two real daemons: every block
// verified, outputs written, daemons stopped cleanly.
func TestRunEmbedded(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two daemons")
	}
	dir := t.TempDir()
	// Iters odd: were the last batch's yardstick trial after it, it would overwrite
	// the blocks verified next.
	cfg := Config{
		Sizes: []uint64{128, 64 << 10, RatioMinBlock}, Blocks: 300, Iters: 3, Transport: "tcp", Timeout: time.Minute, Seed: 42,
		B2BD: buildDaemon(t), JSONPath: filepath.Join(dir, "r.json"), PlotPath: filepath.Join(dir, "r.svg"),
		yardstickBytes: 64 << 20, AdHoc: true, PreparedUpTo: DefaultPreparedUpTo, Yardsticks: []string{YardstickStream, YardstickCached},
		PingCalls: 20, Breakdown: true,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := Run(ctx, cfg, &stdout, &stderr); err != nil {
		t.Fatalf("Run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr is not a terminal, yet got %q", stderr.String())
	}
	for _, want := range []string{"yardstick  cached", "yardstick  'vs TCP'", "from the source region into the destination region", "floor", "ad hoc", "prepared", "breakdown", "ctl x floor", "TCP min-max", "1st batch", "1st x", "adhoc 1st", "prepared 1st", "128 B", "64 KiB", "verified", "0 (host memory)"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	raw, err := os.ReadFile(cfg.JSONPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Complete || rep.Transport != "tcp" || len(rep.Rows) != 3 {
		t.Fatalf("report: complete %v transport %q rows %d", rep.Complete, rep.Transport, len(rep.Rows))
	}
	for _, r := range rep.Rows {
		if !r.Verified || r.Blocks != 300 || r.MedianSeconds <= 0 || r.DaemonCPUSeconds == nil || r.Segments != 300 || len(r.SampleSeconds) != cfg.Iters {
			t.Errorf("row %+v", r)
		}
		if r.Mode != "adhoc" || r.AdHoc == nil || !r.AdHoc.Verified || r.AdHoc.MedianSeconds != r.MedianSeconds {
			t.Errorf("%d B: ad hoc result %+v, mode %q", r.BlockBytes, r.AdHoc, r.Mode)
		}
		if r.AdHoc.PingMedianSeconds == nil || *r.AdHoc.PingMedianSeconds <= 0 || r.AdHoc.CallOverFloor == nil || r.AdHoc.ControlOverFloor == nil || *r.AdHoc.ControlOverFloor <= 0 {
			t.Errorf("%d B: ad hoc floor figures %+v", r.BlockBytes, r.AdHoc)
		}
		// The first (warm-up) batch against the steady state, per mode.
		for name, m := range map[string]*ModeOut{"adhoc": r.AdHoc, "prepared": r.Prepared} {
			if m == nil {
				continue
			}
			if m.FirstSeconds <= 0 || m.FirstPhases == nil || m.FirstPhases.Total <= 0 || m.FirstOverMedian == nil ||
				math.Abs(*m.FirstOverMedian-m.FirstSeconds/m.MedianSeconds) > 1e-9**m.FirstOverMedian {
				t.Errorf("%d B %s: first batch %v s, phases %+v, over median %v (median %v s)", r.BlockBytes, name, m.FirstSeconds, m.FirstPhases, m.FirstOverMedian, m.MedianSeconds)
			}
		}
		if r.GBpsMin <= 0 || r.GBpsMin > r.GBps || r.GBps > r.GBpsMax {
			t.Errorf("%d B: GB/s min %v median %v max %v", r.BlockBytes, r.GBpsMin, r.GBps, r.GBpsMax)
		}
		// The yardstick runs beside the sizes from RatioMinBlock up: one
		// trial of the batch's bytes per timed batch, median with median.
		if r.BlockBytes < RatioMinBlock {
			if r.RatioVsYardstick != nil || r.YardstickGBps != nil {
				t.Errorf("%d B: compared with the yardstick below %d B", r.BlockBytes, RatioMinBlock)
			}
			continue
		}
		if r.RatioVsYardstick == nil || r.YardstickGBps == nil || len(r.YardstickSampleSeconds) != cfg.Iters || r.YardstickTrialBytes != r.PayloadBytes ||
			*r.YardstickMinGBps > *r.YardstickGBps || *r.YardstickGBps > *r.YardstickMaxGBps {
			t.Fatalf("%d B: yardstick %+v", r.BlockBytes, r)
		}
		if want := r.GBps / *r.YardstickGBps; math.Abs(*r.RatioVsYardstick-want) > 1e-9*want {
			t.Errorf("%d B: ratio %v, want %v (median over median)", r.BlockBytes, *r.RatioVsYardstick, want)
		}
		if r.Phases.Yardstick <= 0 {
			t.Errorf("%d B: yardstick phase %v", r.BlockBytes, r.Phases.Yardstick)
		}
	}
	if rep.Yardstick == nil || !rep.Yardstick.Interleaved || rep.YardstickCached == nil || rep.YardstickCached.GBps <= 0 {
		t.Errorf("report yardsticks %+v, cached %+v", rep.Yardstick, rep.YardstickCached)
	}
	for _, r := range rep.Rows[:2] {
		// Both sizes are up to 64 KiB, so prepared runs too: verified, or
		// skipped because this daemon lacks PrepareTransfer (said in the row).
		switch {
		case r.Prepared != nil:
			if !r.Prepared.Verified || len(r.Prepared.SampleSeconds) != cfg.Iters || r.Prepared.PrepareSeconds == nil {
				t.Errorf("%d B: prepared result %+v", r.BlockBytes, r.Prepared)
			}
		case !strings.Contains(r.PreparedNote, "does not implement PrepareTransfer"):
			t.Errorf("%d B: no prepared result and note %q", r.BlockBytes, r.PreparedNote)
		}
	}
	if svg, err := os.ReadFile(cfg.PlotPath); err != nil || !bytes.Contains(svg, []byte("<svg")) {
		t.Errorf("plot: %v", err)
	}
}

// TestRunBadDaemon reports a daemon that cannot start, with its log.
func TestRunBadDaemon(t *testing.T) {
	cfg := Config{Sizes: []uint64{128}, Blocks: 1, Iters: 1, Transport: "auto", Timeout: time.Second, B2BD: "/bin/false"}
	err := Run(context.Background(), cfg, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "exited during start-up") {
		t.Fatalf("Run with /bin/false as the daemon: %v", err)
	}
}

// TestRunOps runs the sweep with --op read and both against two real
// daemons: every row carries its op and verifies, and a local block
// corrupted after the last pull (the verified one) is caught.
func TestRunOps(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two daemons")
	}
	b2bd := buildDaemon(t)
	const corruptBlock = 7
	for _, tc := range []struct {
		name    string
		ops     []string
		corrupt bool // flip a byte of a local block after the verified read
		wantOps []string
		path    string
	}{
		{name: "read", ops: []string{OpRead}, wantOps: []string{OpRead, OpRead}},
		{name: "both", ops: []string{OpWrite, OpRead}, wantOps: []string{OpWrite, OpRead, OpWrite, OpRead}},
		{name: "both over the ring", ops: []string{OpWrite, OpRead}, wantOps: []string{OpWrite, OpRead, OpWrite, OpRead}, path: PathRing},
		{name: "read corrupted over the ring", ops: []string{OpRead}, corrupt: true, path: PathRing},
		{name: "read corrupted", ops: []string{OpRead}, corrupt: true},
		{name: "both corrupted", ops: []string{OpWrite, OpRead}, corrupt: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{
				Sizes: []uint64{128, 4096}, Blocks: 200, Iters: 3, Transport: "tcp", Timeout: time.Minute, Seed: 7,
				B2BD: b2bd, JSONPath: filepath.Join(dir, "r.json"), AdHoc: true, PreparedUpTo: DefaultPreparedUpTo, Ops: tc.ops, Path: tc.path,
			}
			corrupted := 0
			if tc.corrupt {
				cfg.afterBatch = func(ctx context.Context, eps *endpoints, regions *regionPair, op string, iter int, src, dst Layout) error {
					if op != OpRead || iter != cfg.Iters {
						return nil
					}
					hs, ok := regions.src.(hostSource)
					if !ok {
						return errors.New("the local region is not mapped here")
					}
					hs.r.Bytes[src.Offsets[corruptBlock]+src.BlockBytes/2] ^= 0x5a
					corrupted++
					return nil
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var stdout bytes.Buffer
			err := Run(ctx, cfg, &stdout, &bytes.Buffer{})
			if tc.corrupt {
				var m *MismatchError
				if !errors.As(err, &m) || !strings.Contains(err.Error(), "adhoc read: verification failed") {
					t.Fatalf("a local block corrupted after the pull passed verification: %v", err)
				}
				if corrupted != 1 || m.Block != corruptBlock || m.Mismatched != 1 {
					t.Errorf("mismatch %+v after %d corruptions; want block %d, one block", m, corrupted, corruptBlock)
				}
				return
			}
			if err != nil {
				t.Fatalf("Run: %v\n%s", err, stdout.String())
			}
			raw, err := os.ReadFile(cfg.JSONPath)
			if err != nil {
				t.Fatal(err)
			}
			var rep Report
			if err := json.Unmarshal(raw, &rep); err != nil {
				t.Fatal(err)
			}
			var gotOps []string
			for _, r := range rep.Rows {
				gotOps = append(gotOps, r.Op)
				if !r.Verified || r.AdHoc == nil || !r.AdHoc.Verified || r.Prepared == nil || !r.Prepared.Verified || len(r.SampleSeconds) != cfg.Iters || r.Transport != "tcp" {
					t.Errorf("%d B %s: row %+v", r.BlockBytes, r.Op, r)
				}
			}
			if rep.WarmSeconds == nil || *rep.WarmSeconds <= 0 {
				t.Errorf("warm_seconds %v: the pair was not warmed up after registering", rep.WarmSeconds)
			}
			if !rep.Complete || !slices.Equal(gotOps, tc.wantOps) {
				t.Errorf("complete %v, rows' ops %v, want %v", rep.Complete, gotOps, tc.wantOps)
			}
			if !strings.Contains(stdout.String(), "read ") {
				t.Errorf("the table has no read row:\n%s", stdout.String())
			}
		})
	}
}
