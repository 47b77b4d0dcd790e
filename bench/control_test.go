package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestRunControl runs --workload control on two real daemons: every op has
// a gRPC and a ring row from Go (and from Python when the interpreter has
// grpcio and numpy), each with the calls it was asked for and a positive
// median, and the run verified the bytes of every transferring op.
func TestRunControl(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two daemons")
	}
	dir := t.TempDir()
	if abs, err := filepath.Abs(filepath.Join("..", controlPyScript)); err == nil {
		t.Setenv(controlPyEnv, abs) // the test runs in bench/
	}
	cfg, err := ParseFlags([]string{"--workload", "control", "--transport", "tcp", "--b2bd", buildDaemon(t),
		"--json", filepath.Join(dir, "c.json")}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := Run(ctx, cfg, &stdout, &stderr); err != nil {
		t.Fatalf("Run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	raw, err := os.ReadFile(cfg.JSONPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep ControlReport
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Complete || rep.Workload != WorkloadControl || rep.RingOverGRPCPing == nil {
		t.Fatalf("report: complete %v workload %q ratio %v: %s", rep.Complete, rep.Workload, rep.RingOverGRPCPing, rep.Error)
	}
	type key struct{ client, op, path string }
	got := map[key]ControlRow{}
	for _, r := range rep.Rows {
		got[key{r.Client, r.Op, r.Path}] = r
	}
	clients := []string{"go"}
	if exec.Command(controlPython(), "-c", "import grpc, numpy, google.protobuf").Run() == nil && controlPyPath() != "" {
		clients = append(clients, "python")
	}
	t.Logf("clients %v, %d rows", clients, len(rep.Rows))
	ops := map[string][]string{
		"go":     {"ping", "ping_idle", "submit", "blocks", "start_poll", "start_batch64"},
		"python": {"ping", "submit", "blocks", "start_poll", "start_batch64"},
	}
	for _, c := range clients {
		for _, op := range ops[c] {
			for _, path := range []string{"grpc", "ring"} {
				r, ok := got[key{c, op, path}]
				if !ok {
					t.Errorf("no %s %s row over %s:\n%s", c, op, path, stdout.String())
					continue
				}
				if r.Calls <= 0 || r.UsPerRequest.Median <= 0 || r.UsPerRequest.P99 < r.UsPerRequest.Median {
					t.Errorf("%s %s over %s: %+v", c, op, path, r)
				}
			}
		}
	}
}
