package bench

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/gpudirect"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// rawFake is a CUDA driver that records the raw copy's calls.
type rawFake struct {
	gpudirect.Interface // the calls the raw copy does not make panic
	dsts, srcs, sizes   []uint64
	opened, closed      []uintptr
	streams             int
}

func (f *rawFake) IPCOpenMemHandle(dev int, h gpudirect.IPCHandle) (uintptr, error) {
	f.opened = append(f.opened, 0x100000)
	return 0x100000, nil
}
func (f *rawFake) IPCCloseMemHandle(dev int, p uintptr) error {
	f.closed = append(f.closed, p)
	return nil
}
func (f *rawFake) StreamCreate(dev int) (*gpudirect.Stream, error) {
	f.streams++
	return new(gpudirect.Stream), nil
}
func (f *rawFake) StreamDestroy(*gpudirect.Stream) error     { f.streams--; return nil }
func (f *rawFake) StreamSynchronize(*gpudirect.Stream) error { return nil }
func (f *rawFake) MemcpyBatchAsync(_ *gpudirect.Stream, d, s, n []uint64) error {
	f.dsts, f.srcs, f.sizes = slices.Clone(d), slices.Clone(s), slices.Clone(n)
	return nil
}

// TestRawCopy: the raw copy moves block i from the source region's
// srcOffs[i] to the destination region's dstOffs[i] (its IPC mapping plus
// the region's offset in it), in one batch call; Close lets go of the
// stream and the mapping, once.
func TestRawCopy(t *testing.T) {
	f := &rawFake{}
	src := &cudaSource{cuda: f, dev: 1, ptr: 0x5000}
	h := make([]byte, gpudirect.IPCHandleSize)
	h[0] = 1
	dst := &b2bv1.Region{CudaIpcHandle: h, CudaIpcOffset: 0x40}
	c, err := openRawCopy(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	so, do := []uint64{0, 4096, 512}, []uint64{8192, 0, 1024}
	if _, err := c.trial(so, do, 128); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.srcs, []uint64{0x5000, 0x6000, 0x5200}) || !slices.Equal(f.dsts, []uint64{0x102040, 0x100040, 0x100440}) ||
		!slices.Equal(f.sizes, []uint64{128, 128, 128}) {
		t.Fatalf("srcs %#x dsts %#x sizes %v", f.srcs, f.dsts, f.sizes)
	}
	for range 2 {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if f.streams != 0 || !slices.Equal(f.closed, []uintptr{0x100000}) {
		t.Fatalf("after Close twice: %d streams left, mappings closed %#x", f.streams, f.closed)
	}
	if _, err := openRawCopy(src, &b2bv1.Region{CudaIpcHandle: []byte{1}}); err == nil || !strings.Contains(err.Error(), "cuda_ipc_handle") {
		t.Fatalf("a short IPC handle: %v", err)
	}
}

func TestPrintRawCopy(t *testing.T) {
	raw, over, prep := 0.0057, 1.12, 1.04
	rows := []Row{
		{Op: OpWrite, BlockBytes: 128, AdHoc: &ModeOut{RawCopyMedianSeconds: &raw, OverRawCopy: &over}, Prepared: &ModeOut{RawCopyMedianSeconds: &raw, OverRawCopy: &prep}},
		{Op: OpRead, BlockBytes: 128, AdHoc: &ModeOut{}},
		{Op: OpWrite, BlockBytes: 4096, AdHoc: &ModeOut{}},
	}
	var b bytes.Buffer
	printRawCopy(&b, rows)
	out := b.String()
	for _, want := range []string{"5.700 ms", "1.12x", "1.04x"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n != 4 { // two header lines, the two write rows
		t.Errorf("%d lines, want 4:\n%s", n, out)
	}
}
