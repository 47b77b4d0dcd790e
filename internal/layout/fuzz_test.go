package layout

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// fuzzPlanner is reused across fuzz inputs, so that a bit left set in the
// pooled bitmap by one input shows as a wrong answer on a later one.
var fuzzPlanner Planner

// FuzzValidate checks the id decoder and validator against a naive oracle,
// and, for accepted requests, the expansion against the naive copy.
func FuzzValidate(f *testing.F) {
	f.Add(ids(0, 1, 2), ids(2, 1, 0), uint8(4), uint8(4), uint8(3))
	f.Add(ids(5, 6, 7), ids(8, 9, 10), uint8(16), uint8(16), uint8(1))
	f.Add(ids(1, 1), ids(3, 3), uint8(4), uint8(4), uint8(2))
	f.Add([]byte{1, 2, 3}, ids(0), uint8(4), uint8(4), uint8(2))
	f.Add(ids(0), ids(1<<32-1), uint8(4), uint8(4), uint8(2))
	f.Add([]byte{}, []byte{}, uint8(1), uint8(1), uint8(1))
	f.Fuzz(func(t *testing.T, src, dst []byte, nbSrc, nbDst, blockLen uint8) {
		ns, nd, bl := uint64(nbSrc%64)+1, uint64(nbDst%64)+1, uint64(blockLen%4)+1
		p := NewPairT(t, stridedLayout(t, "src", 2, bl, bl, ns), stridedLayout(t, "dst", 2, bl, bl+uint64(nbDst&1), nd), Limits{})
		req := Request{SrcIDs: src, DstIDs: dst}
		got, err := fuzzPlanner.Validate(p, req)
		for i, x := range fuzzPlanner.bitmap {
			if x != 0 {
				t.Fatalf("bitmap word %d = %#x after a request", i, x)
			}
		}
		want := oracle(src, dst, ns, nd)
		if (err == nil) != (want == "") {
			t.Fatalf("Validate err = %v, oracle %q", err, want)
		}
		if err != nil {
			if !errors.Is(err, errs.ErrInvalidArgument) && !errors.Is(err, errs.ErrResourceExhausted) {
				t.Fatalf("err %v has no domain class", err)
			}
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("err = %q, oracle says %q", err, want)
			}
			return
		}
		if !slices.Equal(got.Src, unpack(src)) || !slices.Equal(got.Dst, unpack(dst)) {
			t.Fatalf("decoded %v %v", got.Src, got.Dst)
		}
		checkAgainstNaive(t, p, req, p.Expand(nil, got), rand.New(rand.NewPCG(1, 2)))
	})
}

// oracle says what is wrong with a request the slow way ("" when nothing):
// the part of the message the validator must give.
func oracle(src, dst []byte, ns, nd uint64) string {
	switch {
	case len(src)%4 != 0:
		return "src_ids is"
	case len(dst)%4 != 0:
		return "dst_ids is"
	case len(src) == 0:
		return "src_ids is empty"
	case len(src) != len(dst):
		return "they must be equal"
	}
	s, d := make([]uint32, len(src)/4), make([]uint32, len(dst)/4)
	for i := range s {
		s[i] = binary.LittleEndian.Uint32(src[4*i:])
		d[i] = binary.LittleEndian.Uint32(dst[4*i:])
	}
	for i := range s {
		if uint64(s[i]) >= ns {
			return "src_ids[" + itoa(i) + "]"
		}
		if uint64(d[i]) >= nd {
			return "dst_ids[" + itoa(i) + "]"
		}
		for j := range i {
			if d[j] == d[i] {
				return "dst_ids[" + itoa(i) + "] = " + itoa(int(d[i])) + " repeats dst_ids[" + itoa(j) + "]"
			}
		}
	}
	return ""
}

func itoa(i int) string { return strconv.Itoa(i) }

// FuzzNew builds layouts from arbitrary segment tables over three small
// regions and checks every accepted layout by marking bytes: every block
// inside its region, no byte in two segments.
func FuzzNew(f *testing.F) {
	f.Add([]byte{4, 0, 0, 0, 8, 8, 0, 1, 0, 64, 0, 8, 8, 0})
	f.Add([]byte{4, 0, 0, 0, 8, 32, 0, 0, 8, 0, 8, 32, 0})
	f.Add([]byte{2, 0, 0xff, 0xff, 8, 8, 0x80})
	f.Add([]byte{1})
	regionSizes := map[string]uint64{"r0": 256, "r1": 1000, "r2": 4096}
	names := []string{"r0", "r1", "r2", "missing"}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		nb := uint64(data[0] % 16)
		data = data[1:]
		var segs []Segment
		for len(data) >= 6 && len(segs) < 12 {
			c := data[:6]
			data = data[6:]
			s := Segment{
				Region:    names[c[0]%4],
				Offset:    uint64(binary.LittleEndian.Uint16(c[1:])),
				BlockLen:  uint64(c[3] % 64),
				Stride:    uint64(c[4] % 128),
				NumBlocks: nb,
			}
			switch c[5] >> 6 {
			case 1:
				s.NumBlocks = nb + 1
			case 2:
				s.Offset = math.MaxUint64 - s.Offset
			case 3:
				s.Stride = math.MaxUint64 / (s.Stride + 1)
			}
			segs = append(segs, s)
		}
		l, err := New("kv", segs, sizes(regionSizes), Limits{MaxSegments: 10})
		if err != nil {
			if !errors.Is(err, errs.ErrInvalidArgument) && !errors.Is(err, errs.ErrResourceExhausted) && !errors.Is(err, errs.ErrNotFound) {
				t.Fatalf("err %v has no domain class", err)
			}
			if validByBytes(segs, regionSizes, 10) && !strings.Contains(err.Error(), "interleave") {
				t.Fatalf("valid layout refused: %v\n%+v", err, segs)
			}
			return
		}
		if !validByBytes(segs, regionSizes, 10) {
			t.Fatalf("invalid layout accepted: %+v", segs)
		}
		if l.NumSegments() != len(segs) {
			t.Fatalf("%d segments, want %d", l.NumSegments(), len(segs))
		}
	})
}

// validByBytes is the slow definition of a valid layout.
func validByBytes(segs []Segment, regionSizes map[string]uint64, maxSegs int) bool {
	if len(segs) == 0 || len(segs) > maxSegs || segs[0].NumBlocks == 0 {
		return false
	}
	used := map[string][]bool{}
	for _, s := range segs {
		size, ok := regionSizes[s.Region]
		if !ok || s.NumBlocks != segs[0].NumBlocks || s.BlockLen == 0 || s.Stride < s.BlockLen {
			return false
		}
		if used[s.Region] == nil {
			used[s.Region] = make([]bool, size)
		}
		u := used[s.Region]
		for b := range s.NumBlocks {
			start := s.Offset + b*s.Stride
			// Overflow or past the end, checked without wrapping.
			if b > 0 && s.Stride > (math.MaxUint64-s.Offset)/b {
				return false
			}
			if start >= size || s.BlockLen > size-start {
				return false
			}
			for i := range s.BlockLen {
				if u[start+i] {
					return false
				}
				u[start+i] = true
			}
		}
	}
	return true
}

// FuzzCheckExportName checks the export-name rule against a byte-by-byte
// oracle: a refusal is InvalidArgument naming the field, the quoted value
// (or its length) and the rule; a name the cache key could alias (a NUL)
// is never accepted.
func FuzzCheckExportName(f *testing.F) {
	for _, s := range []string{"", "decode", "a.b/c:d-e_f", "kv\x00read", "kv\n", "k v", "kvé", "\xff", strings.Repeat("x", MaxNameLen+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := CheckExportName("export_name", name)
		bad := len(name) > MaxNameLen
		for i := 0; i < len(name) && !bad; i++ {
			c := name[i]
			bad = !(strings.IndexByte("-_./:", c) >= 0 || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z')
		}
		if (err != nil) != bad {
			t.Fatalf("CheckExportName(%q) = %v, oracle says bad=%v", name, err, bad)
		}
		if err == nil {
			return
		}
		if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), "export_name") {
			t.Fatalf("err %v: want InvalidArgument naming export_name", err)
		}
		if len(name) > MaxNameLen {
			if !strings.Contains(err.Error(), strconv.Itoa(MaxNameLen)) {
				t.Fatalf("err %v does not name the limit", err)
			}
			return
		}
		if !strings.Contains(err.Error(), strconv.Quote(name)) || !strings.Contains(err.Error(), "letters, digits and -_./:") {
			t.Fatalf("err %v does not quote %q and name the rule", err, name)
		}
		if strings.ContainsAny(err.Error(), "\x00\n\r") {
			t.Fatalf("err %q carries a raw control byte", err)
		}
	})
}
