package local

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/gpudirect/cudatest"
)

// TestCalibrate: the start-up calibration times both second-hop choices,
// keeps one, frees what it allocated, and says so; a failed allocation or
// copy leaves one stream and a note saying the calibration failed.
func TestCalibrate(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name, failMethod string
		wantErr          bool
		wantNote         string
	}{
		{"measured", "", false, "calibrated at start"},
		{"no device memory", "MemAlloc", true, "calibration failed"},
		{"a copy fails", "MemcpyBatchAsync", true, "calibration failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cu := cudatest.New(cudatest.Device{TotalMem: 1 << 30})
			s, err := newStage(cu, 0, 8<<20)
			if err != nil {
				t.Fatal(err)
			}
			if tc.failMethod != "" {
				cu.FailNext(tc.failMethod, boom)
			}
			batches0, _ := cu.BatchStats()
			err = s.calibrate(cu)
			if (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, boom)) {
				t.Fatalf("calibrate: %v, want error %v", err, tc.wantErr)
			}
			if !strings.Contains(s.note, tc.wantNote) {
				t.Errorf("note %q lacks %q", s.note, tc.wantNote)
			}
			if !slices.Contains(calSplits, s.split) || tc.wantErr && s.split != 1 {
				t.Errorf("split %d after calibration", s.split)
			}
			if batches, _ := cu.BatchStats(); !tc.wantErr && batches-batches0 < len(calSplits)*(calRounds+1)*2 {
				t.Errorf("%d batched calls: both choices were not timed", batches-batches0)
			}
			if err := s.close(cu); err != nil {
				t.Fatal(err)
			}
			if l := cu.Leaks(); len(l) > 0 {
				t.Fatalf("left behind: %v", l)
			}
		})
	}
}

// TestStatusShowsCalibration: a same-device stage's calibration is in the
// transport's Status detail.
func TestStatusShowsCalibration(t *testing.T) {
	g := newGPUPair(t, 1, 0, 0, 1<<20, Config{})
	if d := g.send.Advertise().Detail; !strings.Contains(d, "[GPU 0: second hop in") || !strings.Contains(d, "calibrated at start") {
		t.Fatalf("Status detail %q: want GPU 0's calibration", d)
	}
	// What the device could not set up is said too.
	g.cu.SetDeviceNotes(0, "host-to-device batches queued by one thread, not in parts: no hold")
	if d := g.send.Advertise().Detail; !strings.Contains(d, "[GPU 0: host-to-device batches queued by one thread, not in parts: no hold]") {
		t.Fatalf("Status detail %q: want GPU 0's device note", d)
	}
}
