package batch

import (
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/region"
)

// TestRegisterLayoutNamesItsFields: a refused layout names the fields of
// RegisterLayoutRequest the caller set (num_blocks, segments[i].region_id),
// not the per-segment fields layout.New checks a peer's resolution by.
func TestRegisterLayoutNamesItsFields(t *testing.T) {
	s, req := rig(t, &fakePeers{})
	seg := func(r string) layout.Segment { return layout.Segment{Region: r, BlockLen: 8, Stride: 8} }
	for _, tc := range []struct {
		name string
		segs []layout.Segment
		n    uint64
		err  error
		msg  string
	}{
		{"num_blocks 0", []layout.Segment{seg(req.Src)}, 0, errs.ErrInvalidArgument, `layout "l": num_blocks is 0`},
		{"num_blocks over the limit", []layout.Segment{seg(req.Src)}, layout.DefaultMaxBlocks + 1, errs.ErrResourceExhausted, "num_blocks = 16777217, over the limit of 16777216"},
		{"region_id empty", []layout.Segment{seg(req.Src), seg("")}, 4, errs.ErrInvalidArgument, "segments[1].region_id is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.layouts.Register("l", tc.segs, tc.n, region.Export{}, req.Caller, region.Lease{})
			if errs.Class(err) != tc.err || !strings.Contains(err.Error(), tc.msg) || strings.Contains(err.Error(), "segments[0].num_blocks") {
				t.Fatalf("%v; want %v naming %q", err, tc.err, tc.msg)
			}
		})
	}
	if _, err := s.layouts.Register("l", []layout.Segment{seg(req.Src)}, 4, region.Export{}, req.Caller, region.Lease{}); err != nil {
		t.Fatalf("a good layout after the refusals: %v", err)
	}
}
