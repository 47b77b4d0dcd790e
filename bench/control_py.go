package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// The control workload's Python rows: client/python/bench_control.py, run
// against the same daemons as the Go rows. Found beside the working
// directory or the bench binary, or at $B2B_BENCH_CONTROL_PY; skipped with
// a note where it or a Python with grpcio and numpy is missing.
const (
	controlPyScript  = "client/python/bench_control.py"
	controlPyEnv     = "B2B_BENCH_CONTROL_PY"
	controlPyTimeout = 5 * time.Minute
)

func controlPyPath() string {
	if p := os.Getenv(controlPyEnv); p != "" {
		return p
	}
	cands := []string{controlPyScript}
	if exe, err := os.Executable(); err == nil {
		cands = append(cands, filepath.Join(filepath.Dir(exe), "..", controlPyScript))
	}
	for _, c := range cands {
		if _, err := os.Stat(c); err == nil {
			return c
		}
	}
	return ""
}

// controlPythonEnv names the interpreter for the Python rows (a GPU host's
// python3 with grpcio may not be /usr/bin/python3).
const controlPythonEnv = "B2B_BENCH_PYTHON"

func controlPython() string {
	if p := os.Getenv(controlPythonEnv); p != "" {
		return p
	}
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return "python3"
}

// controlPyRows runs the script and adds its rows to rep.
func controlPyRows(ctx context.Context, eps *endpoints, rep *ControlReport, out io.Writer) error {
	script := controlPyPath()
	if script == "" {
		fmt.Fprintf(out, "note: no Python rows: %s not found (run from the source tree, or set %s)\n", controlPyScript, controlPyEnv)
		return nil
	}
	py := controlPython()
	if err := exec.CommandContext(ctx, py, "-c", "import grpc, numpy, google.protobuf").Run(); err != nil {
		fmt.Fprintf(out, "note: no Python rows: %s lacks grpcio, numpy or protobuf (%v; %s names another)\n", py, err, controlPythonEnv)
		return nil
	}
	dir, err := os.MkdirTemp("", "b2b-bench-control-py-")
	if err != nil {
		return fmt.Errorf("python rows: %w", err)
	}
	defer os.RemoveAll(dir)
	js := filepath.Join(dir, "rows.json")
	ctx, cancel := context.WithTimeout(ctx, controlPyTimeout)
	defer cancel()
	p := eps.pair
	cmd := exec.CommandContext(ctx, py, script, "--api", p.src.socket, "--submit", filepath.Join(p.stateDir, submitSocketName),
		"--dst-api", p.dst.socket, "--peer", eps.dstPeer, "--json", js)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("python rows: %s: %w: %s", script, err, tail(stderr.String(), 2000))
	}
	b, err := os.ReadFile(js)
	if err != nil {
		return fmt.Errorf("python rows: %w", err)
	}
	var rows []ControlRow
	if err := json.Unmarshal(b, &rows); err != nil {
		return fmt.Errorf("python rows: %s: %w", js, err)
	}
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "python op\tblocks\tpath\tcalls\tmedian\tp99")
	for _, r := range rows {
		if r.Workload != WorkloadControl || r.Client != "python" || (r.Path != "grpc" && r.Path != "ring") || r.Calls == 0 {
			return fmt.Errorf("python rows: %s: row %+v is not a control row of the python client", js, r)
		}
		rep.Rows = append(rep.Rows, r)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%.1f us\t%.1f us\n", r.Op, r.Blocks, r.Path, r.Calls, r.UsPerRequest.Median, r.UsPerRequest.P99)
	}
	return tw.Flush()
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
