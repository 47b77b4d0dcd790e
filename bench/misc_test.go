package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"
)

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func TestCompareDigests(t *testing.T) {
	for _, tc := range []struct {
		name     string
		src, dst []uint64
		want     int
		err      string
		block    int
		count    int
	}{
		{"equal", []uint64{1, 2, 3}, []uint64{1, 2, 3}, 3, "", 0, 0},
		{"one differs", []uint64{1, 2, 3}, []uint64{1, 9, 3}, 3, "block 1", 1, 1},
		{"several differ", []uint64{1, 2, 3, 4}, []uint64{0, 2, 0, 0}, 4, "block 0", 0, 3},
		{"short source", []uint64{1}, []uint64{1, 2}, 2, "source daemon returned 1", 0, 0},
		{"short destination", []uint64{1, 2}, []uint64{1}, 2, "destination daemon returned 1", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CompareDigests(tc.src, tc.dst, tc.want)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
			var m *MismatchError
			if tc.count > 0 && (!errors.As(err, &m) || m.Block != tc.block || m.Mismatched != tc.count) {
				t.Fatalf("err = %#v, want block %d and %d mismatches", err, tc.block, tc.count)
			}
		})
	}
}

func TestParseProcStatCPU(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     uint64
		err      bool
	}{
		{"plain", "1234 (b2bd) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 100 0 0", 325, false},
		{"name with spaces and parens", "77 (a (b) c) R 1 1 1 0 -1 0 0 0 0 0 10 5 0 0", 15, false},
		{"truncated", "77 (x) R 1 2", 0, true},
		{"no name", "garbage", 0, true},
		{"not a number", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 ten 5", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseProcStatCPU(tc.in)
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("ParseProcStatCPU = %d, %v; want %d, error %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestParsePerftest(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[uint64]float64
		err      string
	}{
		{"ok", `{"4096": 12.5, "2097152": 46.1}`, map[uint64]float64{4096: 12.5, 2 << 20: 46.1}, ""},
		{"not an object", `[1,2]`, nil, "JSON object"},
		{"bad key", `{"4K": 1}`, nil, "not a block size"},
		{"zero rate", `{"4096": 0}`, nil, "not a positive rate"},
		{"named run", `{"run": "tuned", "gbps": {"4096": 3.5}}`, map[uint64]float64{4096: 3.5}, ""},
		{"named run without rates", `{"run": "tuned"}`, nil, `"gbps": missing`},
		{"named run, bad rate", `{"run": "tuned", "gbps": {"4096": -1}}`, nil, "not a positive rate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParsePerftest([]byte(tc.in))
			got := p.GBps
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("got %v, %v", got, err)
			}
			if strings.Contains(tc.in, `"run"`) != (p.Run == "tuned") {
				t.Errorf("run %q from %s", p.Run, tc.in)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("size %d: %v, want %v", k, got[k], v)
				}
			}
		})
	}
}

func TestFillRandom(t *testing.T) {
	for _, n := range []int{0, 7, 8, 4096 + 3, 3*fillChunk + 11} {
		a, b, c := make([]byte, n), make([]byte, n), make([]byte, n)
		FillRandom(a, 1)
		FillRandom(b, 1)
		FillRandom(c, 2)
		if !bytes.Equal(a, b) {
			t.Fatalf("%d bytes: the same seed filled differently", n)
		}
		if n >= 8 && bytes.Equal(a, c) {
			t.Fatalf("%d bytes: different seeds filled the same", n)
		}
		if n >= 4096 {
			zeros := bytes.Count(a, []byte{0})
			if zeros > n/64 {
				t.Fatalf("%d bytes: %d zero bytes, not random-looking", n, zeros)
			}
		}
	}
}

func TestStampBlocks(t *testing.T) {
	region := make([]byte, 1024)
	offs := []uint64{0, 512, 256}
	StampBlocks(region, offs, 100, 1)
	first := bytes.Clone(region)
	StampBlocks(region, offs, 100, 2)
	for i, off := range offs {
		head, tail := region[off:off+8], region[off+92:off+100]
		if !bytes.Equal(head, tail) || binary.LittleEndian.Uint64(head) == 0 {
			t.Errorf("block %d: head %x tail %x", i, head, tail)
		}
		if bytes.Equal(head, first[off:off+8]) {
			t.Errorf("block %d: stamp did not change between iterations", i)
		}
		if bytes.ContainsFunc(region[off+8:off+92], func(r rune) bool { return r != 0 }) {
			t.Errorf("block %d: stamp wrote inside the block", i)
		}
	}
	if bytes.ContainsFunc(region[100:256], func(r rune) bool { return r != 0 }) {
		t.Error("stamp wrote into a gap")
	}
	StampBlocks(region, []uint64{1000}, 4, 3) // blocks under 16 bytes get only a head
}

func TestYardstickBytes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plans []SizePlan
		want  uint64
	}{
		{"small sizes only: 1 GiB floor", []SizePlan{{BlockBytes: 4096, Blocks: 10000}}, 1 << 30},
		{"largest big batch", []SizePlan{{BlockBytes: 256 << 10, Blocks: 10000}, {BlockBytes: 512 << 10, Blocks: 2000}}, 256 << 10 * 10000},
		{"8 GiB ceiling", []SizePlan{{BlockBytes: 2 << 20, Blocks: 10000}}, 8 << 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := YardstickBytes(tc.plans); got != tc.want {
				t.Fatalf("YardstickBytes = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestParseProcStatTotals(t *testing.T) {
	for _, tc := range []struct {
		name, in    string
		busy, steal uint64
		err         bool
	}{
		{"typical", "cpu  151641 0 47672 137232 795 0 1423 1015 0 0", 151641 + 47672, 1015, false},
		{"old kernel without guest fields", "cpu 1 2 3 4 5 6 7 8", 1 + 2 + 3, 8, false},
		{"per-cpu line", "cpu0 1 2 3 4 5 6 7 8", 0, 0, true},
		{"short", "cpu 1 2 3", 0, 0, true},
		{"garbage", "cpu a b c d e f g h", 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			busy, steal, err := ParseProcStatTotals(tc.in)
			if (err != nil) != tc.err || busy != tc.busy || steal != tc.steal {
				t.Fatalf("got %d, %d, %v; want %d, %d, error %v", busy, steal, err, tc.busy, tc.steal, tc.err)
			}
		})
	}
}

func TestDisturbanceWarning(t *testing.T) {
	row := func(size uint64, other, steal, timed float64) Row {
		return Row{BlockBytes: size, OtherCPUSeconds: f64(other), StealCPUSeconds: f64(steal), Phases: Phases{Timed: timed}}
	}
	for _, tc := range []struct {
		name string
		rows []Row
		want string
	}{
		{"quiet", []Row{row(128, 0.01, 0, 1)}, ""},
		{"unknown", []Row{{BlockBytes: 128, Phases: Phases{Timed: 1}}}, ""},
		{"busy neighbour", []Row{row(128, 0.01, 0, 1), row(4096, 1.0, 0, 1)}, "up to 50% of this machine's CPU time during the timed batches of 4 KiB"},
		{"steal counts", []Row{row(1<<20, 0, 0.6, 1)}, "1 MiB"},
		{"one clock tick in a tiny window", []Row{row(128, 0.01, 0, 0.02)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := disturbanceWarning(tc.rows, 2)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("disturbanceWarning = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestWantsInsecure(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"--tcp-streams=8"}, true},
		{[]string{"--tls-cert", "a.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"}, false},
		{[]string{"-insecure"}, false},
		{[]string{"--insecure=false"}, false},
	} {
		if got := wantsInsecure(tc.args); got != tc.want {
			t.Errorf("wantsInsecure(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}

// TestMeasureTCPStream: the streaming yardstick delivers the source's bytes
// in order into the destination, cycling through both (a length that is not
// a multiple of the 4 MiB chunk included), and reports the buffers it used.
func TestMeasureTCPStream(t *testing.T) {
	for _, n := range []int{4096 + 5, yardstickChunk + 3, 2*yardstickChunk + 1} {
		src, dst := make([]byte, n), make([]byte, n)
		FillRandom(src, uint64(n))
		ys, err := MeasureTCPStream(context.Background(), src, dst, uint64(2*n), 2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(src, dst) {
			t.Fatalf("%d bytes: the destination differs from the source after whole cycles", n)
		}
		if ys.GBps <= 0 || ys.Bytes != uint64(2*n) || ys.Trials != 2 || ys.SrcBytes != uint64(n) || ys.DstBytes != uint64(n) {
			t.Fatalf("%d bytes: %+v", n, ys)
		}
	}
	if _, err := MeasureTCPStream(context.Background(), nil, make([]byte, 1), 1, 1); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty source: %v", err)
	}
}

// TestYardstickLinkTrials: one connection serves trials of different
// lengths, each from the front of the source into the front of the
// destination (as a batch of those bytes uses the regions' fronts), bytes
// past the trial untouched; Close is idempotent and a trial after it fails.
func TestYardstickLinkTrials(t *testing.T) {
	const n = 3*yardstickChunk + 7
	src, dst := make([]byte, n), make([]byte, n)
	FillRandom(src, 99)
	ctx := context.Background()
	l, err := OpenYardstick(ctx, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		bytes uint64
	}{
		{"one byte", 1},
		{"below a chunk", 4096 + 5},
		{"two chunks and a bit", 2*yardstickChunk + 11},
		{"all of it", n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clear(dst)
			el, err := l.Trial(ctx, tc.bytes)
			if err != nil || el <= 0 {
				t.Fatalf("Trial(%d) = %v, %v", tc.bytes, el, err)
			}
			if !bytes.Equal(dst[:tc.bytes], src[:tc.bytes]) {
				t.Fatalf("the first %d bytes differ", tc.bytes)
			}
			if bytes.ContainsFunc(dst[tc.bytes:], func(r rune) bool { return r != 0 }) {
				t.Fatalf("bytes past the trial's %d were written", tc.bytes)
			}
		})
	}
	if _, err := l.Trial(ctx, 0); err == nil {
		t.Error("a trial of 0 bytes was accepted")
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := l.Trial(ctx, 1); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Trial after Close: %v", err)
	}
	if _, err := OpenYardstick(ctx, src, nil); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty destination: %v", err)
	}
}
