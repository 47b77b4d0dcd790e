package gpudirect

import (
	"errors"
	"fmt"
	"sync"
)

// DeviceRange is checked device memory as the daemon hands it to a
// transport: [Addr, Addr+Len) on Device, inside one allocation, with
// SYNC_MEMOPS set and, where the device supports it, exported as a dma-buf.
type DeviceRange struct {
	Device int
	Addr   uintptr
	Len    uint64
	// DmabufFD exports the range for ibv_reg_dmabuf_mr; -1 when none.
	DmabufFD int
	// DmabufOffset is Addr's offset inside the dma-buf.
	DmabufOffset uint64
}

// CheckDeviceMemory verifies that [ptr, ptr+size) is device memory of dev
// inside one allocation, as registering it with a NIC requires.
func CheckDeviceMemory(c Interface, dev int, ptr uintptr, size uint64) error {
	if size == 0 {
		return fmt.Errorf("%w: gpudirect: device memory range at %#x is empty", ErrInvalidValue, ptr)
	}
	pi, err := c.PointerInfo(dev, ptr)
	if err != nil {
		return err
	}
	if pi.MemoryType != MemoryTypeDevice {
		return fmt.Errorf("%w: gpudirect: address %#x is %s memory, not device memory", ErrInvalidValue, ptr, pi.MemoryType)
	}
	if pi.Device != dev {
		return fmt.Errorf("%w: gpudirect: address %#x belongs to device %d, not device %d", ErrInvalidValue, ptr, pi.Device, dev)
	}
	if pi.RangeSize != 0 {
		end := uint64(ptr) + size
		if end < uint64(ptr) || uint64(ptr) < uint64(pi.RangeStart) || end > uint64(pi.RangeStart)+pi.RangeSize {
			return fmt.Errorf("%w: gpudirect: range [%#x, +%d) leaves its allocation [%#x, +%d)", ErrInvalidValue, ptr, size, pi.RangeStart, pi.RangeSize)
		}
	}
	return nil
}

// DeviceMemory checks [ptr, ptr+size) on dev, sets SYNC_MEMOPS on it, and
// exports it as dma-buf where the device supports that. It returns the range
// (DmabufFD -1 when not exported) and a release function that closes the
// dma-buf (it does not free the memory); release is safe to call twice.
func DeviceMemory(c Interface, dev int, ptr uintptr, size uint64) (DeviceRange, func() error, error) {
	return deviceMemory(c, dev, ptr, size, true)
}

// deviceMemory is DeviceMemory. With strict false (memory mapped from
// another process through CUDA IPC), the driver refusing SYNC_MEMOPS or the
// dma-buf export is not an error: the memory is returned without a dma-buf
// (DmabufFD -1). On an H100 with driver 580 / CUDA 13, the export of an IPC
// mapping fails with CUDA_ERROR_INVALID_VALUE, and the mapping reports
// CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 0.
func deviceMemory(c Interface, dev int, ptr uintptr, size uint64, strict bool) (DeviceRange, func() error, error) {
	m := DeviceRange{Addr: ptr, Len: size, Device: dev, DmabufFD: -1}
	if err := CheckDeviceMemory(c, dev, ptr, size); err != nil {
		return DeviceRange{}, nil, err
	}
	if err := c.SetSyncMemops(dev, ptr); err != nil && (strict || ResultOf(err) == Success) {
		return DeviceRange{}, nil, err
	}
	info, err := c.DeviceInfo(dev)
	if err != nil {
		return DeviceRange{}, nil, err
	}
	if !info.DmabufSupported || !c.Capabilities().DmabufExport {
		return m, func() error { return nil }, nil
	}
	db, err := c.ExportDmabuf(dev, ptr, size, 0)
	if err != nil {
		if !strict && ResultOf(err) != Success {
			return m, func() error { return nil }, nil
		}
		return DeviceRange{}, nil, err
	}
	m.DmabufFD = db.FD
	m.DmabufOffset = db.Offset
	return m, db.Close, nil
}

// Regions allocates daemon-owned GPU regions and imports applications'
// allocations through their IPC handles. Each returned DeviceRange is
// checked device memory with SYNC_MEMOPS set and, where the device supports
// it, a dma-buf export for ibv_reg_dmabuf_mr. (internal/staging.Regions
// adapts it to the region registry.)
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
func (a Regions) Alloc(device int, size uint64) (DeviceRange, []byte, func() error, error) {
	if size == 0 {
		return DeviceRange{}, nil, nil, fmt.Errorf("%w: gpudirect: cuda_alloc.size is 0", ErrInvalidValue)
	}
	ptr, err := a.CUDA.MemAlloc(device, size)
	if err != nil {
		return DeviceRange{}, nil, nil, err
	}
	m, closeDmabuf, err := DeviceMemory(a.CUDA, device, ptr, size)
	if err != nil {
		return DeviceRange{}, nil, nil, errors.Join(err, a.CUDA.MemFree(device, ptr))
	}
	h, err := a.CUDA.IPCGetMemHandle(device, ptr)
	if err != nil {
		return DeviceRange{}, nil, nil, errors.Join(err, closeDmabuf(), a.CUDA.MemFree(device, ptr))
	}
	release := once(func() error { return errors.Join(closeDmabuf(), a.CUDA.MemFree(device, ptr)) })
	return m, h[:], release, nil
}

// Import opens an application's IPC handle on device and returns
// [offset, offset+size) of the allocation, with a release function (safe
// twice) that closes the dma-buf and the IPC mapping.
func (a Regions) Import(device int, handle []byte, offset, size uint64) (DeviceRange, func() error, error) {
	h, err := ParseIPCHandle("cuda_ipc.handle", handle)
	if err != nil {
		return DeviceRange{}, nil, err
	}
	if size == 0 {
		return DeviceRange{}, nil, fmt.Errorf("%w: gpudirect: cuda_ipc.size is 0", ErrInvalidValue)
	}
	base, err := a.CUDA.IPCOpenMemHandle(device, h)
	if err != nil {
		return DeviceRange{}, nil, err
	}
	undo := func(err error) (DeviceRange, func() error, error) {
		return DeviceRange{}, nil, errors.Join(err, a.CUDA.IPCCloseMemHandle(device, base))
	}
	pi, err := a.CUDA.PointerInfo(device, base)
	if err != nil {
		return undo(err)
	}
	if end := offset + size; end < offset || (pi.RangeSize != 0 && end > pi.RangeSize) {
		return undo(fmt.Errorf("%w: gpudirect: cuda_ipc.offset %d + cuda_ipc.size %d exceeds the %d-byte allocation", ErrInvalidValue, offset, size, pi.RangeSize))
	}
	m, closeDmabuf, err := deviceMemory(a.CUDA, device, base+uintptr(offset), size, false)
	if err != nil {
		return undo(err)
	}
	rememberImport(a.CUDA, device, base, h)
	release := once(func() error {
		forgetImport(a.CUDA, device, base)
		return errors.Join(closeDmabuf(), a.CUDA.IPCCloseMemHandle(device, base))
	})
	return m, release, nil
}
