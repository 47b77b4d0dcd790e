package gpudirect

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// FuzzParseIPCHandle checks the IPC handle validator on arbitrary input: it
// never panics, accepts exactly the 64-byte handles that are not all zeros
// (returning them unchanged), and otherwise fails with ErrInvalidArgument
// naming the field. Seeds are in testdata/fuzz/FuzzParseIPCHandle.
func FuzzParseIPCHandle(f *testing.F) {
	f.Add([]byte{}, "cuda_ipc.handle")
	f.Add(bytes.Repeat([]byte{1}, IPCHandleSize), "cuda_ipc.handle")
	f.Fuzz(func(t *testing.T, b []byte, field string) {
		h, err := ParseIPCHandle(field, b)
		valid := len(b) == IPCHandleSize && !bytes.Equal(b, make([]byte, IPCHandleSize))
		if valid {
			if err != nil {
				t.Fatalf("valid %d-byte handle rejected: %v", len(b), err)
			}
			if !bytes.Equal(h[:], b) {
				t.Fatalf("handle changed: %x -> %x", b, h)
			}
			return
		}
		if err == nil {
			t.Fatalf("invalid input (len %d) accepted", len(b))
		}
		if !errors.Is(err, ErrInvalidValue) {
			t.Fatalf("error %v does not wrap ErrInvalidArgument", err)
		}
		name := field
		if name == "" {
			name = "ipc_handle"
		}
		if !strings.Contains(err.Error(), name) {
			t.Fatalf("error %q does not name field %q", err, name)
		}
		if h != (IPCHandle{}) {
			t.Fatalf("non-zero handle returned with an error")
		}
	})
}
