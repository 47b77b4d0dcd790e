package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestNewKVRequest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pool, ids int
		seed      uint64
	}{
		{"the issue's request", DefaultKVPool, DefaultKVRequest, 1},
		{"every block", 64, 64, 2},
		{"one id", 1, 1, 3},
		{"a few of many", 1 << 16, 7, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := NewKVRequest(tc.pool, tc.ids, tc.seed)
			if err != nil {
				t.Fatal(err)
			}
			for side, ids := range map[string][]uint32{"local": q.Local, "remote": q.Remote} {
				if len(ids) != tc.ids {
					t.Fatalf("%s: %d ids, want %d", side, len(ids), tc.ids)
				}
				seen := make(map[uint32]bool, len(ids))
				for i, id := range ids {
					if int(id) >= tc.pool {
						t.Fatalf("%s[%d] = %d, not below the pool's %d", side, i, id, tc.pool)
					}
					if seen[id] {
						t.Fatalf("%s[%d] = %d repeats", side, i, id)
					}
					seen[id] = true
				}
			}
			again, _ := NewKVRequest(tc.pool, tc.ids, tc.seed)
			if !slices.Equal(q.Local, again.Local) || !slices.Equal(q.Remote, again.Remote) {
				t.Fatal("the same seed drew different ids")
			}
			if tc.ids > 4 {
				if slices.Equal(q.Local, q.Remote) {
					t.Error("local and remote ids are the same draw")
				}
				other, _ := NewKVRequest(tc.pool, tc.ids, tc.seed+1)
				if slices.Equal(q.Local, other.Local) {
					t.Error("another seed drew the same local ids")
				}
			}
		})
	}
	for _, bad := range [][2]int{{8, 9}, {8, 0}, {0, 1}} {
		if _, err := NewKVRequest(bad[0], bad[1], 1); err == nil {
			t.Errorf("pool %d, %d ids: no error", bad[0], bad[1])
		}
	}
}

func TestKVDescriptors(t *testing.T) {
	s := KVShape{Segments: 2, Pool: 4, Request: 2, Block: 100}
	q := KVRequest{Local: []uint32{3, 0}, Remote: []uint32{1, 2}}
	src, dst := q.Descriptors(s)
	// Segment-major: segment 1 starts at 4 blocks of 100 bytes.
	if want := []uint64{300, 0, 700, 400}; !slices.Equal(src, want) {
		t.Errorf("src %v, want %v", src, want)
	}
	if want := []uint64{100, 200, 500, 600}; !slices.Equal(dst, want) {
		t.Errorf("dst %v, want %v", dst, want)
	}
}

func TestCompareKV(t *testing.T) {
	q := KVRequest{Local: []uint32{5, 6, 7}, Remote: []uint32{1, 2, 3}}
	want := []uint64{1, 2, 3, 4, 5, 6}
	if err := compareKV("blocks", q, want, slices.Clone(want)); err != nil {
		t.Fatalf("equal digests: %v", err)
	}
	got := slices.Clone(want)
	got[4]++ // segment 1, entry 1
	var m *KVMismatchError
	if err := compareKV("blocks", q, want, got); !errors.As(err, &m) || m.Segment != 1 || m.Entry != 1 || m.LocalID != 6 || m.RemoteID != 2 || m.Mismatched != 1 {
		t.Fatalf("one wrong block: %v", err)
	}
	if err := compareKV("blocks", q, want, got[:5]); err == nil {
		t.Fatal("a missing digest passed")
	}
}

// kvTestConfig is a small KV run against two real daemons over TCP.
func kvTestConfig(t *testing.T, perSegment bool) Config {
	return Config{
		Workload: WorkloadKV, KV: KVShape{Segments: 6, Pool: 32, Request: 8, Block: 4096, PerSegmentRegions: perSegment},
		Repeat: 2, Transport: "tcp", Timeout: time.Minute, Seed: 7, B2BD: buildDaemon(t), Sizes: DefaultSizes(), Blocks: 1, Iters: 1,
		JSONPath: filepath.Join(t.TempDir(), "kv.json"),
	}
}

// TestRunKV runs both modes over both region shapes: every request
// verified, both rows in the JSON with their phases.
func TestRunKV(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two daemons")
	}
	for _, perSegment := range []bool{true, false} {
		cfg := kvTestConfig(t, perSegment)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		var stdout bytes.Buffer
		err := Run(ctx, cfg, &stdout, &bytes.Buffer{})
		cancel()
		if err != nil {
			t.Fatalf("per-segment %v: %v\n%s", perSegment, err, stdout.String())
		}
		for _, want := range []string{"descriptors", "blocks", "ratio", "non-wire", "yes (3/3)"} {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
			}
		}
		raw, err := os.ReadFile(cfg.JSONPath)
		if err != nil {
			t.Fatal(err)
		}
		var rep KVReport
		if err := json.Unmarshal(raw, &rep); err != nil {
			t.Fatal(err)
		}
		if !rep.Complete || rep.Workload != WorkloadKV || len(rep.Rows) != 2 || rep.NonWireRatio == nil || rep.Transport != "tcp" {
			t.Fatalf("report %+v", rep)
		}
		if perSegment && (!rep.KV.SrcSharedMemory || !rep.KV.DstSharedMemory || rep.KV.Regions != KVRegionsSegment) {
			t.Errorf("embedded per-segment pools should share the span's file: %+v", rep.KV)
		}
		for i, mode := range []string{KVModeDescriptors, KVModeBlocks} {
			r := rep.Rows[i]
			if r.Workload != WorkloadKV || r.Mode != mode || r.Blocks != 48 || r.Bytes != 48*4096 || !r.Verified || r.Phases == nil ||
				r.NonWireSeconds <= 0 || len(r.Samples) != cfg.Repeat || r.Transport != "tcp" {
				t.Errorf("row %d: %+v", i, r)
			}
		}
	}
}

// TestRunKVCatchesWrongBlock corrupts one destination block after a
// blocks request lands: the run must fail naming it. Were verification
// skipped, Run would succeed.
func TestRunKVCatchesWrongBlock(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two daemons")
	}
	cfg := kvTestConfig(t, true)
	const seg, entry = 4, 5
	var hit KVRequest
	cfg.kvAfterRequest = func(ctx context.Context, eps *endpoints, pools *kvPools, mode string, q KVRequest) error {
		if mode != KVModeBlocks || hit.Local != nil {
			return nil
		}
		hit = q
		h, err := eps.dst.MapHostRegion(ctx, pools.dst.span)
		if err != nil {
			return err
		}
		defer h.Unmap()
		s := pools.shape
		h.Bytes[uint64(seg)*s.SegmentBytes()+uint64(q.Remote[entry])*s.Block+123] ^= 0x5a
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := Run(ctx, cfg, &bytes.Buffer{}, &bytes.Buffer{})
	var m *KVMismatchError
	if !errors.As(err, &m) {
		t.Fatalf("a corrupted destination block passed verification: %v", err)
	}
	if m.Mode != KVModeBlocks || m.Segment != seg || m.Entry != entry || m.RemoteID != hit.Remote[entry] || m.Mismatched != 1 {
		t.Errorf("mismatch %+v, want segment %d entry %d (remote id %d), one block", m, seg, entry, hit.Remote[entry])
	}
	raw, rerr := os.ReadFile(cfg.JSONPath)
	if rerr != nil {
		t.Fatal(rerr)
	}
	var rep KVReport
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Complete || len(rep.Rows) != 2 || rep.Rows[1].Verified || rep.Rows[1].Error == "" {
		t.Errorf("the report of a failed verification: complete %v rows %+v", rep.Complete, rep.Rows)
	}
}

func TestParseFlagsKV(t *testing.T) {
	cfg, err := ParseFlags([]string{"--workload", "kv", "--kv-segments", "4", "--kv-block", "16K", "--kv-pool", "64", "--kv-request", "8", "--kv-regions", "one", "--repeat", "3"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (KVShape{Segments: 4, Block: 16 << 10, Pool: 64, Request: 8}); cfg.Workload != WorkloadKV || cfg.KV != want || cfg.Repeat != 3 {
		t.Errorf("config %+v %+v", cfg.KV, cfg)
	}
	cfg, err = ParseFlags(nil, &bytes.Buffer{})
	if err != nil || cfg.Workload != WorkloadSweep || cfg.KV.Segments != DefaultKVSegments || cfg.KV.Block != DefaultKVBlock || !cfg.KV.PerSegmentRegions || cfg.Repeat != DefaultKVRepeat {
		t.Errorf("defaults: %v %+v", err, cfg.KV)
	}
	for _, bad := range [][]string{
		{"--workload", "kv", "--kv-request", "2000"},
		{"--workload", "kv", "--kv-regions", "two"},
		{"--workload", "kv", "--repeat", "0"},
		{"--workload", "kv", "--kv-segments", "0"},
		{"--workload", "kv", "--kv-block", "0"},
		{"--workload", "kv", "--kv-segments", "4096", "--kv-pool", "4096", "--kv-request", "4096"},
		{"--workload", "nope"},
	} {
		if _, err := ParseFlags(bad, &bytes.Buffer{}); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}
