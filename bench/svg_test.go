package bench

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
)

func fullSweep(withPerftest bool) *Report {
	rep := &Report{Transport: "tcp", Mode: "embedded", Iterations: 5, Host: HostOut{CPUs: 2},
		Yardstick: &YardstickOut{GBps: 3.5, Bytes: 1 << 30, Trials: 3}}
	for _, s := range DefaultSizes() {
		r := sampleRow(s)
		r.MedianSeconds = 0.002 + float64(s)*1e-9
		r.MinSeconds, r.P99Seconds = r.MedianSeconds*0.9, r.MedianSeconds*1.3
		r.GBps, r.MblocksPerSec = GBps(r.PayloadBytes, secs(r.MedianSeconds)), MblocksPerSec(r.Blocks, secs(r.MedianSeconds))
		if s >= 2<<20 {
			r.Capped = true
		}
		if withPerftest {
			r.PerftestGBps = f64(float64(s) / 1e4)
		}
		rep.Rows = append(rep.Rows, r)
	}
	return rep
}

func TestSVGIsWellFormed(t *testing.T) {
	failed := fullSweep(false)
	failed.Rows[3].MedianSeconds, failed.Rows[3].GBps, failed.Rows[3].MblocksPerSec = 0, 0, 0
	oneRow := &Report{Rows: []Row{sampleRow(4096)}, Iterations: 5}
	hostile := fullSweep(false)
	hostile.Transport = `<tcp & "friends">`
	for _, tc := range []struct {
		name string
		rep  *Report
		want []string
	}{
		{"full sweep", fullSweep(false), []string{"GB/s", "million blocks/s", "block size (bytes, log2 scale)", "128", "2M", "TCP loopback yardstick", "b2bd BatchTransfer"}},
		{"with perftest", fullSweep(true), []string{"ib_write_bw (perftest)"}},
		{"a failed size", failed, []string{"1K"}},
		{"one row", oneRow, []string{"4K"}},
		{"no rows", &Report{}, []string{"Throughput"}},
		{"text needing escapes", hostile, []string{"&lt;tcp &amp; &#34;friends&#34;&gt;"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteSVG(&b, tc.rep); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			dec := xml.NewDecoder(strings.NewReader(out))
			root := ""
			for {
				tok, err := dec.Token()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("not well-formed XML: %v\n%s", err, out)
				}
				if se, ok := tok.(xml.StartElement); ok && root == "" {
					root = se.Name.Local
				}
			}
			if root != "svg" {
				t.Fatalf("root element %q, want svg", root)
			}
			for _, bad := range []string{"NaN", "Inf"} {
				if strings.Contains(out, bad) {
					t.Errorf("output contains %s", bad)
				}
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q", w)
				}
			}
		})
	}
}

func TestFormatTick(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{{0.001, "0.001"}, {0.2, "0.2"}, {1, "1"}, {50, "50"}, {1000, "1000"}, {3 * 0.1, "0.3"}} {
		if got := formatTick(tc.v); got != tc.want {
			t.Errorf("formatTick(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}
