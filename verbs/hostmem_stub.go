//go:build !cgo || !linux

package verbs

// HostMem is C memory (stub).
type HostMem struct{}

// AllocHost is unavailable without cgo.
func AllocHost(n int) (*HostMem, error) { return nil, errUnavailable }
func (h *HostMem) Addr() uintptr        { return 0 }
func (h *HostMem) Bytes() []byte        { return nil }
func (h *HostMem) Free()                {}
