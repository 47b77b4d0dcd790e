package gpudirect

import (
	"errors"
	"fmt"
	"sync"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
)

// Regions adapts an Interface to the region registry's CUDA hook
// (internal/region.CUDA): allocate daemon-owned GPU regions, and import
// applications' allocations through their IPC handles. Each returned
// memory.Memory is checked device memory with SYNC_MEMOPS set and, where the
// device supports it, a dma-buf export for ibv_reg_dmabuf_mr.
type Regions struct {
	CUDA Interface
}

// once makes a release function idempotent.
func once(f func() error) func() error {
	var o sync.Once
	var err error
	return func() error {
		o.Do(func() { err = f() })
		return err
	}
}

// Alloc allocates size bytes on device and returns the memory, its IPC
// handle (IPCHandleSize bytes) and a release function (safe twice) that
// closes the dma-buf and frees the memory.
func (a Regions) Alloc(device int, size uint64) (memory.Memory, []byte, func() error, error) {
	if size == 0 {
		return memory.Memory{}, nil, nil, fmt.Errorf("%w: gpudirect: cuda_alloc.size is 0", errs.ErrInvalidArgument)
	}
	ptr, err := a.CUDA.MemAlloc(device, size)
	if err != nil {
		return memory.Memory{}, nil, nil, err
	}
	m, closeDmabuf, err := DeviceMemory(a.CUDA, device, ptr, size)
	if err != nil {
		return memory.Memory{}, nil, nil, errors.Join(err, a.CUDA.MemFree(device, ptr))
	}
	h, err := a.CUDA.IPCGetMemHandle(device, ptr)
	if err != nil {
		return memory.Memory{}, nil, nil, errors.Join(err, closeDmabuf(), a.CUDA.MemFree(device, ptr))
	}
	release := once(func() error { return errors.Join(closeDmabuf(), a.CUDA.MemFree(device, ptr)) })
	return m, h[:], release, nil
}

// Import opens an application's IPC handle on device and returns
// [offset, offset+size) of the allocation, with a release function (safe
// twice) that closes the dma-buf and the IPC mapping.
func (a Regions) Import(device int, handle []byte, offset, size uint64) (memory.Memory, func() error, error) {
	h, err := ParseIPCHandle("cuda_ipc.handle", handle)
	if err != nil {
		return memory.Memory{}, nil, err
	}
	if size == 0 {
		return memory.Memory{}, nil, fmt.Errorf("%w: gpudirect: cuda_ipc.size is 0", errs.ErrInvalidArgument)
	}
	base, err := a.CUDA.IPCOpenMemHandle(device, h)
	if err != nil {
		return memory.Memory{}, nil, err
	}
	undo := func(err error) (memory.Memory, func() error, error) {
		return memory.Memory{}, nil, errors.Join(err, a.CUDA.IPCCloseMemHandle(device, base))
	}
	pi, err := a.CUDA.PointerInfo(device, base)
	if err != nil {
		return undo(err)
	}
	if end := offset + size; end < offset || (pi.RangeSize != 0 && end > pi.RangeSize) {
		return undo(fmt.Errorf("%w: gpudirect: cuda_ipc.offset %d + cuda_ipc.size %d exceeds the %d-byte allocation", errs.ErrInvalidArgument, offset, size, pi.RangeSize))
	}
	m, closeDmabuf, err := deviceMemory(a.CUDA, device, base+uintptr(offset), size, false)
	if err != nil {
		return undo(err)
	}
	release := once(func() error { return errors.Join(closeDmabuf(), a.CUDA.IPCCloseMemHandle(device, base)) })
	return m, release, nil
}
