package gpudirect

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestLoadMissingLibrary(t *testing.T) {
	tests := []struct {
		name string
		lib  string
	}{
		{"no such file", "libcuda-b2bd-does-not-exist.so.1"},
		{"no such path", "/nonexistent/dir/libcuda.so.1"},
		{"empty name", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(WithLibrary(tt.lib))
			if err == nil {
				c.Close()
				t.Fatalf("Load(%q) succeeded", tt.lib)
			}
			if !errors.Is(err, ErrNoDriver) || !errors.Is(err, ErrUnavailable) {
				t.Fatalf("Load(%q) = %v; want it to wrap ErrNoDriver (an ErrUnavailable)", tt.lib, err)
			}
			if !strings.Contains(err.Error(), "host memory is still served") {
				t.Errorf("Load(%q) error %q does not say the daemon keeps serving host memory", tt.lib, err)
			}
			if tt.lib != "" && !strings.Contains(err.Error(), tt.lib) {
				t.Errorf("Load(%q) error %q does not name the library", tt.lib, err)
			}
		})
	}
}

func TestParseIPCHandle(t *testing.T) {
	valid := bytes.Repeat([]byte{0xab}, IPCHandleSize)
	tests := []struct {
		name    string
		field   string
		in      []byte
		wantErr string // "" for success
	}{
		{"valid", "cuda_ipc.handle", valid, ""},
		{"nil", "cuda_ipc.handle", nil, "cuda_ipc.handle: a CUDA IPC handle is 64 bytes, got 0"},
		{"short", "cuda_ipc.handle", valid[:63], "cuda_ipc.handle: a CUDA IPC handle is 64 bytes, got 63"},
		{"long", "req.h", append(append([]byte{}, valid...), 1), "req.h: a CUDA IPC handle is 64 bytes, got 65"},
		{"zeros", "cuda_ipc.handle", make([]byte, IPCHandleSize), "cuda_ipc.handle: CUDA IPC handle is all zeros"},
		{"default field name", "", []byte{1}, "ipc_handle: a CUDA IPC handle is 64 bytes, got 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := ParseIPCHandle(tt.field, tt.in)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("ParseIPCHandle: %v", err)
				}
				if !bytes.Equal(h[:], tt.in) {
					t.Fatalf("handle %x, want %x", h, tt.in)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ParseIPCHandle = %v; want ErrInvalidArgument mentioning %q", err, tt.wantErr)
			}
			if h != (IPCHandle{}) {
				t.Fatalf("handle %x returned with an error", h)
			}
		})
	}
}

func TestAlignRange(t *testing.T) {
	const pg = 4096
	tests := []struct {
		name        string
		addr        uintptr
		size, page  uint64
		base        uintptr
		length, off uint64
		ok          bool
	}{
		{"aligned", 0x10000, 8192, pg, 0x10000, 8192, 0, true},
		{"unaligned start", 0x10010, 100, pg, 0x10000, 4096, 0x10, true},
		{"crosses a page", 0x10ff0, 0x20, pg, 0x10000, 8192, 0xff0, true},
		{"unaligned end", 0x10000, 4097, pg, 0x10000, 8192, 0, true},
		{"64K pages", 0x12345, 1, 65536, 0x10000, 65536, 0x2345, true},
		{"empty", 0x10000, 0, pg, 0, 0, 0, false},
		{"page not a power of two", 0x10000, 1, 3000, 0, 0, 0, false},
		{"overflow", ^uintptr(0) - 10, 100, pg, 0, 0, 0, false},
		{"end rounds past the top", ^uintptr(0) - 4095, 1, pg, 0, 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, length, off, ok := AlignRange(tt.addr, tt.size, tt.page)
			if ok != tt.ok || base != tt.base || length != tt.length || off != tt.off {
				t.Fatalf("AlignRange(%#x, %d, %d) = %#x, %d, %#x, %v; want %#x, %d, %#x, %v",
					tt.addr, tt.size, tt.page, base, length, off, ok, tt.base, tt.length, tt.off, tt.ok)
			}
			if ok && (uint64(base)+off != uint64(tt.addr) || off+tt.size > length || length%tt.page != 0) {
				t.Fatalf("result does not cover the range")
			}
		})
	}
}

func TestNormalizePCIBusID(t *testing.T) {
	tests := []struct{ in, want string }{
		{"0000:3B:00.0", "0000:3b:00.0"},
		{"00000000:3B:00.0", "0000:3b:00.0"},
		{"0001:C1:00.0\x00\x00junk", "0001:c1:00.0"},
		{"00010000:01:00.0", "00010000:01:00.0"}, // a real 8-digit domain stays
		{"", ""},
	}
	for _, tt := range tests {
		if got := NormalizePCIBusID(tt.in); got != tt.want {
			t.Errorf("NormalizePCIBusID(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestResultSentinels(t *testing.T) {
	tests := []struct {
		r    Result
		want error
	}{
		{ErrorInvalidValue, ErrInvalidValue},
		{ErrorInvalidHandle, ErrInvalidValue},
		{ErrorOutOfMemory, ErrOutOfMemory},
		{ErrorNotSupported, ErrNotSupported},
		{ErrorNotPermitted, ErrNotPermitted},
		{ErrorHostMemoryAlreadyRegistered, ErrAlreadyExists},
		{ErrorHostMemoryNotRegistered, ErrNotFound},
		{ErrorInvalidContext, ErrInvalidState},
		{ErrorNoDevice, ErrUnavailable},
		{ErrorIllegalAddress, ErrUnavailable},
		{Result(12345), ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.r.String(), func(t *testing.T) {
			err := wrapForTest(tt.r)
			if !errors.Is(err, tt.want) {
				t.Fatalf("%v does not wrap %v", err, tt.want)
			}
			if ResultOf(err) != tt.r {
				t.Fatalf("ResultOf = %v, want %v", ResultOf(err), tt.r)
			}
		})
	}
	if ResultOf(errors.New("x")) != Success {
		t.Fatal("ResultOf(non-CUDA error) != Success")
	}
}

func wrapForTest(r Result) error {
	return errors.Join(errors.New("context"), &Error{Result: r})
}

func TestErrorText(t *testing.T) {
	tests := []struct {
		e    Error
		want string
	}{
		{Error{Result: ErrorOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY", Desc: "out of memory"}, "CUDA_ERROR_OUT_OF_MEMORY: out of memory"},
		{Error{Result: ErrorOutOfMemory}, "CUDA_ERROR_OUT_OF_MEMORY"},
		{Error{Result: 4242}, "CUresult(4242)"},
	}
	for _, tt := range tests {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestCheckBatch(t *testing.T) {
	tests := []struct {
		name             string
		dsts, srcs, lens []uint64
		wantErr          string
	}{
		{"ok", []uint64{1, 2}, []uint64{3, 4}, []uint64{5, 6}, ""},
		{"empty", nil, nil, nil, ""},
		{"short dsts", []uint64{1}, []uint64{3, 4}, []uint64{5, 6}, "1 destinations, 2 sources, 2 sizes"},
		{"short srcs", []uint64{1, 2}, []uint64{3}, []uint64{5, 6}, "2 destinations, 1 sources, 2 sizes"},
		{"zero size", []uint64{1, 2}, []uint64{3, 4}, []uint64{5, 0}, "batch copy 1 has size 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckBatch(tt.dsts, tt.srcs, tt.lens)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("checkBatch = %v; want ErrInvalidArgument mentioning %q", err, tt.wantErr)
			}
		})
	}
}
