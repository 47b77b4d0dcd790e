package daemon

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// TestCalibrationFileRoundTrip: what writeCalibration keeps,
// readCalibration gives back for the same fingerprint, and refuses for
// another.
func TestCalibrationFileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "c.json")
	c := &transport.Calibration{Elapsed: time.Second, Rows: []transport.CalibrationRow{
		{Route: transport.Route{From: memory.CUDA, To: memory.CUDA, SameDevice: true}, BlockBytes: 128, Blocks: 10000,
			Median: map[transport.Kind]time.Duration{"local": 7 * time.Millisecond, "tcp": 6 * time.Millisecond},
			Failed: map[transport.Kind]string{"verbs": "no GPU memory"}},
	}}
	if err := writeCalibration(path, "fp", c); err != nil {
		t.Fatal(err)
	}
	got, err := readCalibration(path, "fp")
	if err != nil {
		t.Fatal(err)
	}
	r := got.Rows[0]
	if len(got.Rows) != 1 || r.Route != c.Rows[0].Route || r.BlockBytes != 128 || r.Blocks != 10000 || r.Median["tcp"] != 6*time.Millisecond ||
		r.Failed["verbs"] != "no GPU memory" || got.Elapsed != time.Second {
		t.Fatalf("read back %+v", got)
	}
	if _, err := readCalibration(path, "another host"); !errors.Is(err, errs.ErrFailedPrecondition) {
		t.Fatalf("another fingerprint: %v, want FailedPrecondition", err)
	}
}

// TestParseCalibrationRefuses: every malformed row is refused, naming
// the field.
func TestParseCalibrationRefuses(t *testing.T) {
	row := func(s string) string { return `{"fingerprint":"fp","rows":[` + s + `]}` }
	cases := []struct{ name, in, says string }{
		{"not JSON", "{", "unexpected end"},
		{"memory kind", row(`{"from":"disk","to":"host","block_bytes":1,"blocks":1,"median_ns":{"tcp":1}}`), `memory kind "disk"`},
		{"no block size", row(`{"from":"host","to":"host","block_bytes":0,"blocks":1,"median_ns":{"tcp":1}}`), "block_bytes 0"},
		{"no medians", row(`{"from":"host","to":"host","block_bytes":1,"blocks":1,"median_ns":{}}`), "0 medians"},
		{"zero time", row(`{"from":"host","to":"host","block_bytes":1,"blocks":1,"median_ns":{"tcp":0}}`), `median_ns["tcp"] = 0`},
		{"auto as a kind", row(`{"from":"host","to":"host","block_bytes":1,"blocks":1,"median_ns":{"auto":5}}`), `median_ns["auto"]`},
		{"bad kind name", row(`{"from":"host","to":"host","block_bytes":1,"blocks":1,"median_ns":{"t\u0000cp":5}}`), `median_ns["t\x00cp"]`},
		{"too large", `{"fingerprint":"` + strings.Repeat("x", maxCalibrationFile) + `"}`, "over the limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseCalibration([]byte(c.in), "fp")
			if err == nil || !strings.Contains(err.Error(), c.says) || !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("parse: %v, want InvalidArgument saying %q", err, c.says)
			}
		})
	}
}

// FuzzParseCalibration: any file either parses into rows auto can use
// (known routes, sizes above 0, positive times) or is refused; nothing
// panics.
func FuzzParseCalibration(f *testing.F) {
	f.Add([]byte(`{"fingerprint":"fp","rows":[{"from":"host","to":"cuda","block_bytes":128,"blocks":10,"median_ns":{"tcp":5,"local":7}}]}`))
	f.Add([]byte(`{"fingerprint":"fp","rows":[]}`))
	f.Add([]byte(`{"fingerprint":"other"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseCalibration(b, "fp")
		if err != nil {
			return
		}
		for _, r := range c.Rows {
			if !r.Route.Known() || r.BlockBytes == 0 || r.Blocks <= 0 || len(r.Median) == 0 {
				t.Fatalf("accepted row %+v", r)
			}
			for k, d := range r.Median {
				if d <= 0 || transport.CheckName(string(k)) != nil {
					t.Fatalf("accepted median %q = %v", k, d)
				}
			}
		}
		c.Decide([]transport.Kind{"local", "tcp"})
		c.Choose(transport.Route{From: memory.Host, To: memory.Host}, 4096, []transport.Kind{"local", "tcp"})
	})
}

// TestLoopbackOf: the daemon dials itself at its listen address, or at
// 127.0.0.1 where it listens on every address (the VM testbed's daemons
// listen on their own IP only).
func TestLoopbackOf(t *testing.T) {
	for in, want := range map[string]string{
		"[::]:7470": "127.0.0.1:7470", "0.0.0.0:7470": "127.0.0.1:7470", ":7470": "127.0.0.1:7470",
		"10.77.0.2:7470": "10.77.0.2:7470", "127.0.0.1:40245": "127.0.0.1:40245", "[fd00::2]:7470": "[fd00::2]:7470",
	} {
		if got, err := loopbackOf(in); err != nil || got != want {
			t.Errorf("loopbackOf(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := loopbackOf("no-port"); err == nil {
		t.Error("an address without a port was taken")
	}
}
