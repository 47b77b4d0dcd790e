package region

// GPU regions, allocated and imported through the CUDA hook.

import (
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
)

// CUDA allocates and imports GPU memory; the gpudirect layer implements it.
type CUDA interface {
	// Alloc allocates size bytes on device and returns the memory, its IPC
	// handle, and a function that frees it.
	Alloc(device int, size uint64) (memory.Memory, []byte, func() error, error)
	// Import opens an IPC handle and returns [offset, offset+size) of it.
	Import(device int, handle []byte, offset, size uint64) (memory.Memory, func() error, error)
}

// AllocCUDA allocates GPU memory on device.
func (g *Registry) AllocCUDA(device int, size uint64, export Export, who Caller, lease ...Lease) (*Region, error) {
	if g.cfg.CUDA == nil {
		return nil, fmt.Errorf("%w: cuda_alloc: this daemon has no usable GPU: %s", errs.ErrFailedPrecondition, g.cfg.CUDAWhy)
	}
	if size == 0 {
		return nil, fmt.Errorf("%w: cuda_alloc.size is 0", errs.ErrInvalidArgument)
	}
	if err := export.check(); err != nil {
		return nil, err
	}
	mem, ipc, free, err := g.cfg.CUDA.Alloc(device, size)
	if err != nil {
		return nil, err
	}
	return g.add(&Region{Mem: mem, IPC: ipc, release: free, Owner: who}, export, lease)
}

// ImportCUDA maps an application's GPU allocation through its IPC handle.
func (g *Registry) ImportCUDA(device int, handle []byte, offset, size uint64, export Export, who Caller, lease ...Lease) (*Region, error) {
	if g.cfg.CUDA == nil {
		return nil, fmt.Errorf("%w: cuda_ipc: this daemon has no usable GPU: %s", errs.ErrFailedPrecondition, g.cfg.CUDAWhy)
	}
	if size == 0 {
		return nil, fmt.Errorf("%w: cuda_ipc.size is 0", errs.ErrInvalidArgument)
	}
	if err := export.check(); err != nil {
		return nil, err
	}
	mem, free, err := g.cfg.CUDA.Import(device, handle, offset, size)
	if err != nil {
		return nil, err
	}
	return g.add(&Region{Mem: mem, release: free, Owner: who}, export, lease)
}
