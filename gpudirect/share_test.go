package gpudirect_test

import (
	"testing"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/gpudirect/cudatest"
)

// ShareHandle hands on the allocation's own handle for memory the daemon
// allocated, and the application's handle for memory it imported (which
// the driver cannot re-export), each with the right offset.
func TestShareHandle(t *testing.T) {
	d := cudatest.New(cudatest.Device{Name: "mock"})
	defer d.Close()
	p, err := d.MemAlloc(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	own, err := d.IPCGetMemHandle(0, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		off     uint64
		size    uint64
		wantErr bool
	}{
		{"base", 0, 1 << 20, false},
		{"inside", 4096, 100, false},
		{"past the end", 1<<20 - 50, 100, true},
	} {
		h, off, err := gpudirect.ShareHandle(d, 0, p+uintptr(tc.off), tc.size)
		if (err != nil) != tc.wantErr {
			t.Fatalf("%s: err %v, want error %v", tc.name, err, tc.wantErr)
		}
		if err == nil && (h != own || off != tc.off) {
			t.Fatalf("%s: handle %x.. offset %d, want the allocation's handle and %d", tc.name, h[:4], off, tc.off)
		}
	}
	m, release, err := gpudirect.Regions{CUDA: d}.Import(0, own[:], 8192, 100)
	if err != nil {
		t.Fatal(err)
	}
	h, off, err := gpudirect.ShareHandle(d, 0, m.Addr, m.Len)
	if err != nil || h != own || off != 8192 {
		t.Fatalf("imported memory: %x.. at %d, %v; want the application's handle at 8192", h[:4], off, err)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := gpudirect.ShareHandle(d, 0, m.Addr, m.Len); err == nil {
		t.Fatal("a released import is still shared")
	}
}
