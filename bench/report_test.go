package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

func f64(v float64) *float64 { return &v }

func sampleRow(size uint64) Row {
	sms := SMsUsed(b2bv1.MemoryKind_MEMORY_KIND_HOST, b2bv1.MemoryKind_MEMORY_KIND_HOST)
	return Row{
		BlockBytes: size, Blocks: 10000, BlocksRequested: 10000, PayloadBytes: size * 10000, Iterations: 5,
		MedianSeconds: 0.01, P99Seconds: 0.012, MinSeconds: 0.009, SampleSeconds: []float64{0.01, 0.009, 0.012, 0.01, 0.011},
		GBps: float64(size) * 10000 / 0.01 / 1e9, MblocksPerSec: 1, SMsUsed: sms.Count, SMsUsedLabel: sms.Label,
		DaemonCPUSeconds: f64(0.02), DaemonCPUScope: cpuScopeBoth, Transport: "tcp", Verified: true,
	}
}

// TestJSONShape pins the keys that downstream scripts read.
func TestJSONShape(t *testing.T) {
	small, big := sampleRow(4096), sampleRow(1<<20)
	big.YardstickGBps, big.RatioVsYardstick = f64(4), f64(0.5)
	big.PerftestGBps, big.RatioVsPerftest = f64(40), f64(0.05)
	big.Capped, big.Blocks = true, 9000
	twoHost := sampleRow(128)
	twoHost.DaemonCPUSeconds, twoHost.DaemonCPUScope = nil, ""
	rep := &Report{Transport: "tcp", Mode: "embedded", Iterations: 5, Rows: []Row{small, big, twoHost}, Complete: true,
		Yardstick: &YardstickOut{Kind: "tcp", GBps: 4, Bytes: 1 << 30, Trials: 3}}
	path := filepath.Join(t.TempDir(), "r.json")
	if err := WriteJSON(path, rep); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Transport string           `json:"transport"`
		Rows      []map[string]any `json:"rows"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if got.Transport != "tcp" || len(got.Rows) != 3 {
		t.Fatalf("transport %q, %d rows", got.Transport, len(got.Rows))
	}
	type kind int
	const (
		number kind = iota
		boolean
		text
		null
		absent
	)
	for _, tc := range []struct {
		row  int
		key  string
		want kind
	}{
		{0, "block_bytes", number}, {0, "blocks", number}, {0, "median_seconds", number}, {0, "p99_seconds", number},
		{0, "gbps", number}, {0, "mblocks_per_s", number}, {0, "sms_used", number}, {0, "verified", boolean},
		{0, "daemon_cpu_seconds", number}, {0, "capped", boolean}, {0, "transport", text},
		{0, "yardstick_gbps", absent}, {0, "ratio_vs_yardstick", absent}, {0, "perftest_gbps", absent}, {0, "ratio_vs_perftest", absent},
		{1, "yardstick_gbps", number}, {1, "ratio_vs_yardstick", number}, {1, "perftest_gbps", number}, {1, "ratio_vs_perftest", number},
		{1, "capped", boolean},
		{2, "daemon_cpu_seconds", null},
	} {
		v, ok := got.Rows[tc.row][tc.key]
		var k kind
		switch v.(type) {
		case float64:
			k = number
		case bool:
			k = boolean
		case string:
			k = text
		case nil:
			k = null
		}
		if !ok {
			k = absent
		}
		if k != tc.want {
			t.Errorf("row %d %q = %#v (present %v), want kind %d", tc.row, tc.key, v, ok, tc.want)
		}
	}
	if got.Rows[0]["sms_used"].(float64) != 0 {
		t.Errorf("host memory sms_used = %v, want 0", got.Rows[0]["sms_used"])
	}
}

func TestSMsUsed(t *testing.T) {
	host, cuda := b2bv1.MemoryKind_MEMORY_KIND_HOST, b2bv1.MemoryKind_MEMORY_KIND_CUDA
	for _, tc := range []struct {
		name  string
		kinds []b2bv1.MemoryKind
		count *int
		label string
	}{
		{"host to host", []b2bv1.MemoryKind{host, host}, new(int), "0 (host memory)"},
		{"GPU source", []b2bv1.MemoryKind{cuda, host}, nil, "n/a (GPU memory)"},
		{"unknown kind", []b2bv1.MemoryKind{host, b2bv1.MemoryKind_MEMORY_KIND_UNSPECIFIED}, nil, "n/a (GPU memory)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := SMsUsed(tc.kinds...)
			if got.Label != tc.label || (got.Count == nil) != (tc.count == nil) || (got.Count != nil && *got.Count != *tc.count) {
				t.Fatalf("SMsUsed = %+v, want %v %q", got, tc.count, tc.label)
			}
		})
	}
}

func TestTableRow(t *testing.T) {
	var b strings.Builder
	tb := &table{w: &b, perftest: true}
	tb.header()
	r := sampleRow(1 << 20)
	r.Capped, r.Blocks = true, 9000
	r.YardstickGBps, r.RatioVsYardstick = f64(2), f64(1.25)
	tb.row(r)
	failed := sampleRow(128)
	failed.Verified, failed.MedianSeconds = false, 0
	tb.row(failed)
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines:\n%s", len(lines), b.String())
	}
	for _, want := range []string{"1 MiB", "9000*", "10.000 ms", "1.25x", "0 (host memory)", "yes", "0.02"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("row %q lacks %q", lines[1], want)
		}
	}
	if !strings.Contains(lines[0], "perftest GB/s") || !strings.HasSuffix(lines[2], "no") {
		t.Errorf("header %q / failed row %q", lines[0], lines[2])
	}
}

// TestFirstBatchShown: the first batch and its ratio to the steady-state
// median are in the table (from the row's primary mode), the breakdown
// (one line per mode) and the JSON.
func TestFirstBatchShown(t *testing.T) {
	r := sampleRow(4096)
	r.Mode = "adhoc"
	r.AdHoc = &ModeOut{MedianSeconds: 0.002, FirstSeconds: 0.25, FirstOverMedian: f64(125),
		Phases: &PhaseOut{Post: 0.001, Total: 0.0015}, FirstPhases: &PhaseOut{Post: 0.24, Total: 0.245}}
	r.Prepared = &ModeOut{MedianSeconds: 0.001, FirstSeconds: 0.0011, FirstOverMedian: f64(1.1),
		Phases: &PhaseOut{Total: 0.0009}, FirstPhases: &PhaseOut{Total: 0.001}}
	var b strings.Builder
	tb := &table{w: &b, prepared: true}
	tb.header()
	tb.row(r)
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if !strings.Contains(lines[0], "1st batch") || !strings.Contains(lines[0], "1st x") {
		t.Errorf("header %q lacks the first-batch columns", lines[0])
	}
	if !strings.Contains(lines[1], "250.000 ms") || !strings.Contains(lines[1], "125.00x") {
		t.Errorf("row %q lacks the first batch (250.000 ms, 125.00x)", lines[1])
	}
	b.Reset()
	printBreakdown(&b, []Row{r}, nil)
	for _, want := range []string{"adhoc 1st  250000.0", "240000.0", "prepared 1st"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("breakdown lacks %q:\n%s", want, b.String())
		}
	}
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		AdHoc map[string]any `json:"adhoc"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"first_seconds", "first_over_median", "first_phases"} {
		if _, ok := got.AdHoc[k]; !ok {
			t.Errorf("adhoc JSON lacks %q: %s", k, raw)
		}
	}
}

func TestOverallTransport(t *testing.T) {
	for _, tc := range []struct {
		rows []Row
		want string
	}{
		{nil, ""},
		{[]Row{{Transport: "tcp"}, {Transport: "tcp"}}, "tcp"},
		{[]Row{{Transport: "tcp"}, {}}, "tcp"},
		{[]Row{{Transport: "tcp"}, {Transport: "verbs"}}, "mixed"},
	} {
		if got := overallTransport(tc.rows); got != tc.want {
			t.Errorf("overallTransport(%v) = %q, want %q", tc.rows, got, tc.want)
		}
	}
}
