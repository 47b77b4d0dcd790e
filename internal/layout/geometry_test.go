package layout

import (
	"errors"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// TestGeometryError: the refusals a stale resolution of the other side's
// layout can cause are *GeometryError naming their side (so that the daemon
// resolves once more); the request's own faults are not.
func TestGeometryError(t *testing.T) {
	p := NewPairT(t, stridedLayout(t, "src", 2, 8, 8, 4), stridedLayout(t, "dst", 2, 8, 8, 6), Limits{})
	for _, tc := range []struct {
		name     string
		src, dst []uint32
		geometry bool
		srcSide  bool
	}{
		{"src id out of range", []uint32{4}, []uint32{0}, true, true},
		{"dst id out of range", []uint32{0}, []uint32{6}, true, false},
		{"repeated dst id", []uint32{0, 1}, []uint32{2, 2}, false, false},
		{"length mismatch", []uint32{0, 1}, []uint32{2}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w Planner
			_, err := w.Validate(p, Request{SrcIDs: PackIDs(tc.src), DstIDs: PackIDs(tc.dst)})
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("err %v: want InvalidArgument", err)
			}
			var ge *GeometryError
			if errors.As(err, &ge) != tc.geometry {
				t.Fatalf("err %v: GeometryError %v, want %v", err, ge != nil, tc.geometry)
			}
			if ge != nil && (ge.Src != tc.srcSide || ge.Dst == tc.srcSide) {
				t.Fatalf("err %v: side src=%v dst=%v, want src=%v", err, ge.Src, ge.Dst, tc.srcSide)
			}
		})
	}
	for _, other := range []*Layout{stridedLayout(t, "three", 3, 8, 8, 4), stridedLayout(t, "wide", 2, 16, 16, 4)} {
		err := Compatible(stridedLayout(t, "src", 2, 8, 8, 4), other)
		var ge *GeometryError
		if !errors.As(err, &ge) || !ge.Src || !ge.Dst || !errors.Is(err, errs.ErrInvalidArgument) {
			t.Fatalf("Compatible with %q: %v, want an InvalidArgument GeometryError of both sides", other.Name(), err)
		}
	}
}
