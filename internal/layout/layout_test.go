package layout

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// sizes resolves region names from a fixed table; an unknown name is
// NotFound, as the daemon's registry answers.
func sizes(m map[string]uint64) func(string) (uint64, error) {
	return func(name string) (uint64, error) {
		s, ok := m[name]
		if !ok {
			return 0, fmt.Errorf("%w: region %q", errs.ErrNotFound, name)
		}
		return s, nil
	}
}

func seg(region string, off, blockLen, stride, n uint64) Segment {
	return Segment{Region: region, Offset: off, BlockLen: blockLen, Stride: stride, NumBlocks: n}
}

func TestNewRejects(t *testing.T) {
	regions := sizes(map[string]uint64{"r0": 1 << 20, "r7": 8192, "small": 64})
	many := make([]Segment, 3)
	for i := range many {
		many[i] = seg("r0", uint64(i)*4096, 4096, 4096*3, 4)
	}
	cases := []struct {
		name  string
		lname string
		segs  []Segment
		lim   Limits
		want  error
		msgs  []string
	}{
		{"empty name", "", []Segment{seg("r0", 0, 8, 8, 1)}, Limits{}, errs.ErrInvalidArgument, []string{"layout name is empty"}},
		{"long name", strings.Repeat("n", MaxNameLen+1), []Segment{seg("r0", 0, 8, 8, 1)}, Limits{}, errs.ErrInvalidArgument, []string{"129 bytes", "limit of 128"}},
		{"zero segments", "kv", nil, Limits{}, errs.ErrInvalidArgument, []string{`layout "kv": segments is empty`}},
		{"too many segments", "kv", many, Limits{MaxSegments: 2}, errs.ErrResourceExhausted, []string{"segments has 3 entries, over the limit of 2"}},
		{"num_blocks 0", "kv", []Segment{seg("r0", 0, 8, 8, 0)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[0].num_blocks is 0"}},
		{"num_blocks over limit", "kv", []Segment{seg("r0", 0, 8, 8, 17)}, Limits{MaxBlocks: 16}, errs.ErrResourceExhausted, []string{"segments[0].num_blocks = 17, over the limit of 16"}},
		{"num_blocks over default", "kv", []Segment{seg("r0", 0, 1, 1, DefaultMaxBlocks+1)}, Limits{}, errs.ErrResourceExhausted, []string{"num_blocks = 16777217, over the limit of 16777216"}},
		{"num_blocks differ", "kv", []Segment{seg("r0", 0, 8, 8, 4), seg("r0", 64, 8, 8, 4), seg("r0", 128, 8, 8, 5)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[2].num_blocks = 5 differs from segments[0].num_blocks = 4"}},
		{"region empty", "kv", []Segment{seg("r0", 0, 8, 8, 1), seg("", 0, 8, 8, 1)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[1].region is empty"}},
		{"region unknown", "kv", []Segment{seg("r0", 0, 8, 8, 1), seg("nope", 0, 8, 8, 1)}, Limits{}, errs.ErrNotFound, []string{`segments[1].region "nope"`}},
		{"block_len 0", "kv", []Segment{seg("r0", 0, 0, 8, 1)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[0].block_len is 0"}},
		{"stride below block", "kv", []Segment{seg("r0", 0, 8, 8, 2), seg("r0", 1024, 16, 8, 2)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[1].stride = 8 is below block_len = 16"}},
		{"stride below block, one block", "kv", []Segment{seg("r0", 0, 16, 0, 1)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[0].stride = 0 is below block_len = 16"}},
		{"outside region", "kv", []Segment{seg("r0", 0, 8, 8, 1), seg("r0", 8, 8, 8, 1), seg("r0", 16, 8, 8, 1), seg("r7", 808, 8192, 8192, 1)}, Limits{}, errs.ErrInvalidArgument,
			[]string{"segments[3].offset + (num_blocks-1)*stride + block_len = 808 + 0*8192 + 8192 = 9000 > region \"r7\" size 8192"}},
		{"outside region by stride", "kv", []Segment{seg("small", 0, 8, 16, 5)}, Limits{}, errs.ErrInvalidArgument, []string{"0 + 4*16 + 8 = 72 > region \"small\" size 64"}},
		{"offset overflow", "kv", []Segment{seg("r0", math.MaxUint64-3, 8, 8, 1)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[0]", "overflows 64 bits", `region "r0" size 1048576`}},
		{"stride overflow", "kv", []Segment{seg("r0", 0, 8, math.MaxUint64/2, 4)}, Limits{}, errs.ErrInvalidArgument, []string{"overflows 64 bits"}},
		{"overlap same offset", "kv", []Segment{seg("r0", 0, 8, 8, 4), seg("r0", 0, 8, 8, 4)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[0] [0,32) and segments[1] [0,32) overlap in region \"r0\""}},
		{"overlap inside a block", "kv", []Segment{seg("r0", 100, 16, 32, 4), seg("r0", 112, 8, 32, 4)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[0] [100,212) and segments[1] [112,216) overlap"}},
		{"overlap spilling into next block", "kv", []Segment{seg("r0", 0, 8, 32, 4), seg("r0", 28, 8, 32, 4)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[0]", "segments[1]", "overlap"}},
		{"strides differ, blocks meet", "kv", []Segment{seg("r0", 0, 8, 64, 4), seg("r0", 192, 8, 8, 4)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[0] and segments[1] interleave", "(64 and 8)"}},
		{"overlap later segment", "kv", []Segment{seg("r0", 0, 8, 8, 4), seg("r7", 0, 8, 8, 4), seg("r0", 24, 8, 8, 4)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[0] [0,32) and segments[2] [24,56) overlap"}},
		{"overlap one block", "kv", []Segment{seg("r0", 0, 8, 8, 1), seg("r0", 4, 8, 8, 1)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[0] [0,8) and segments[1] [4,12) overlap"}},
		{"interleaved strides differ", "kv", []Segment{seg("r0", 0, 8, 32, 4), seg("r0", 8, 8, 16, 4)}, Limits{}, errs.ErrInvalidArgument, []string{"segments[0] and segments[1] interleave in region \"r0\" with different strides (32 and 16)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.lname, c.segs, regions, c.lim)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			for _, m := range c.msgs {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("err = %q, want it to contain %q", err, m)
				}
			}
		})
	}
}

func TestNewAccepts(t *testing.T) {
	regions := sizes(map[string]uint64{"r": 1 << 16, "k": 4096, "v": 4096})
	cases := []struct {
		name string
		segs []Segment
	}{
		{"region per segment", []Segment{seg("k", 0, 512, 512, 8), seg("v", 0, 512, 512, 8)}},
		{"exactly to the end", []Segment{seg("k", 4096-512, 512, 512, 1), seg("v", 0, 512, 512, 1)}},
		{"strided, exactly to the end", []Segment{seg("k", 4096-8-4*16, 8, 16, 5)}},
		{"back to back in one region", []Segment{seg("r", 0, 64, 64, 16), seg("r", 1024, 64, 64, 16)}},
		{"interleaved (cross-layer)", []Segment{seg("r", 0, 64, 256, 16), seg("r", 64, 64, 256, 16), seg("r", 128, 128, 256, 16)}},
		{"interleaved, listed out of order", []Segment{seg("r", 128, 128, 256, 16), seg("r", 0, 64, 256, 16), seg("r", 64, 64, 256, 16)}},
		{"interleaved far apart", []Segment{seg("r", 0, 8, 64, 4), seg("r", 8+64*2, 8, 64, 4)}},
		{"half blocks", []Segment{seg("r", 32, 32, 64, 16)}},
		{"stride far above block", []Segment{seg("r", 0, 1, 4096, 16)}},
		{"strides differ, extents apart", []Segment{seg("r", 0, 8, 16, 4), seg("r", 64, 8, 32, 4)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := New("kv", c.segs, regions, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if l.NumSegments() != len(c.segs) || l.NumBlocks() != c.segs[0].NumBlocks {
				t.Fatalf("layout has %d segments of %d blocks", l.NumSegments(), l.NumBlocks())
			}
			for i, s := range c.segs {
				tp := l.Template(i)
				if r := l.Regions()[tp.Region]; r.Name != s.Region || tp.Base != s.Offset || tp.Stride != s.Stride || tp.BlockLen != s.BlockLen {
					t.Errorf("template %d = %+v (region %q), segment %+v", i, tp, r.Name, s)
				}
			}
		})
	}
}

// TestDisjointMatchesBytes: the O(1) overlap rule for equal strides agrees
// with marking every byte, over all small shapes.
func TestDisjointMatchesBytes(t *testing.T) {
	const size = 512
	regions := sizes(map[string]uint64{"r": size})
	for n := uint64(1); n <= 4; n++ {
		for stride := uint64(1); stride <= 12; stride++ {
			for la := uint64(1); la <= stride; la++ {
				for lb := uint64(1); lb <= stride; lb++ {
					for ob := uint64(0); ob <= 3*stride+2; ob++ {
						a, b := seg("r", 5, la, stride, n), seg("r", 5+ob, lb, stride, n)
						_, err := New("kv", []Segment{a, b}, regions, Limits{})
						if overlapBytes(size, a, b) != (err != nil) {
							t.Fatalf("a=%+v b=%+v: bytes overlap %v, New err %v", a, b, overlapBytes(size, a, b), err)
						}
					}
				}
			}
		}
	}
}

func overlapBytes(size int, segs ...Segment) bool {
	used := make([]bool, size)
	for _, s := range segs {
		for b := uint64(0); b < s.NumBlocks; b++ {
			for i := uint64(0); i < s.BlockLen; i++ {
				o := s.Offset + b*s.Stride + i
				if used[o] {
					return true
				}
				used[o] = true
			}
		}
	}
	return false
}

func TestCompatible(t *testing.T) {
	regions := sizes(map[string]uint64{"r": 1 << 16})
	mk := func(name string, lens ...uint64) *Layout {
		var segs []Segment
		off := uint64(0)
		for _, l := range lens {
			segs = append(segs, seg("r", off, l, l, 4))
			off += 4 * l
		}
		l, err := New(name, segs, regions, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	cases := []struct {
		name     string
		src, dst *Layout
		msgs     []string
	}{
		{"segment count", mk("prefill", 8, 8, 8), mk("decode", 8, 8), []string{`"prefill" has 3 segments, "decode" has 2`}},
		{"block_len", mk("prefill", 8, 16, 8), mk("decode", 8, 16, 4), []string{`segments[2].block_len is 8 in "prefill" and 4 in "decode"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Compatible(c.src, c.dst)
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
			if _, perr := NewPair(c.src, c.dst, Limits{}); perr == nil || perr.Error() != err.Error() {
				t.Fatalf("NewPair err = %v, want %v", perr, err)
			}
			for _, m := range c.msgs {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("err = %q, want it to contain %q", err, m)
				}
			}
		})
	}
	// Different strides, offsets, regions and num_blocks are compatible.
	other, err := New("other", []Segment{seg("r", 100, 8, 64, 9), seg("r", 108, 16, 64, 9), seg("r", 124, 8, 64, 9)}, regions, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := Compatible(mk("a", 8, 16, 8), other); err != nil {
		t.Fatal(err)
	}
}
