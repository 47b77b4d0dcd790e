package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRunPaths runs --workload paths on two real daemons (host memory):
// for each size, a row for auto and for each transport, every one
// verified block by block, auto carried by a transport the daemon named,
// and a summary that compares auto with the fastest.
func TestRunPaths(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two daemons")
	}
	dir := t.TempDir()
	cfg, err := ParseFlags([]string{"--workload", "paths", "--b2bd", buildDaemon(t), "--sizes", "128,64K", "--blocks", "500", "--iters", "6",
		"--json", filepath.Join(dir, "p.json")}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stdout bytes.Buffer
	if err := Run(ctx, cfg, &stdout, io.Discard); err != nil {
		t.Fatalf("Run: %v\n%s", err, stdout.String())
	}
	raw, err := os.ReadFile(cfg.JSONPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep PathsReport
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Complete || len(rep.Summary) != 2 || len(rep.Rows) != 6 || len(rep.Calibration) == 0 {
		t.Fatalf("report: complete %v, %d summaries, %d rows, calibration %s: %s\n%s", rep.Complete, len(rep.Summary), len(rep.Rows), rep.Calibration, rep.Error, stdout.String())
	}
	for _, r := range rep.Rows {
		if !r.Verified || r.MedianMS <= 0 || r.Carried == "" || (r.Transport != "auto" && r.Carried != r.Transport) {
			t.Errorf("row %+v", r)
		}
	}
	for _, s := range rep.Summary {
		if s.AutoChose == "" || s.Best == "" || s.AutoOverBest <= 0 {
			t.Errorf("summary %+v", s)
		}
	}
}
