package staging

import (
	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/memory"
)

// Regions adapts gpudirect.Regions to the region registry's CUDA hook
// (internal/region.CUDA): the ranges become memory.Memory, and errors carry
// the daemon's domain errors (DomainError).
type Regions struct {
	CUDA gpudirect.Interface
}

func cudaMemory(r gpudirect.DeviceRange) memory.Memory {
	return memory.Memory{Kind: memory.CUDA, Addr: r.Addr, Len: r.Len, Device: r.Device, DmabufFD: r.DmabufFD, DmabufOffset: r.DmabufOffset}
}

// releaseErr maps a release function's errors.
func releaseErr(f func() error) func() error {
	return func() error { return DomainError(f()) }
}

// Alloc is gpudirect.Regions.Alloc.
func (a Regions) Alloc(device int, size uint64) (memory.Memory, []byte, func() error, error) {
	r, h, release, err := gpudirect.Regions{CUDA: a.CUDA}.Alloc(device, size)
	if err != nil {
		return memory.Memory{}, nil, nil, DomainError(err)
	}
	return cudaMemory(r), h, releaseErr(release), nil
}

// Import is gpudirect.Regions.Import.
func (a Regions) Import(device int, handle []byte, offset, size uint64) (memory.Memory, func() error, error) {
	r, release, err := gpudirect.Regions{CUDA: a.CUDA}.Import(device, handle, offset, size)
	if err != nil {
		return memory.Memory{}, nil, DomainError(err)
	}
	return cudaMemory(r), releaseErr(release), nil
}
