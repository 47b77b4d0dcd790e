//go:build cgo && linux

package gpudirect

/*
#include "cuda_shim.h"
*/
import "C"

import (
	"fmt"
	"syscall"
	"unsafe"
)

// ---- device memory -----------------------------------------------------------

func (d *driver) MemAlloc(dev int, size uint64) (uintptr, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, fmt.Errorf("%w: gpudirect: cuMemAlloc_v2 on device %d: size is 0", ErrInvalidValue, dev)
	}
	ds, err := d.device(dev)
	if err != nil {
		return 0, err
	}
	var p C.CUdeviceptr
	var rc C.int
	if err := ds.w.do(func() {
		if rc = C.b2b_mem_alloc(d.tab, C.size_t(size), &p); rc == 0 {
			ds.allocs[uintptr(p)] = size
		}
	}); err != nil {
		return 0, err
	}
	if err := d.callErr(rc, dev, "cuMemAlloc_v2(size=%d)", size); err != nil {
		return 0, err
	}
	return uintptr(p), nil
}

func (d *driver) MemFree(dev int, ptr uintptr) error {
	ds, err := d.device(dev)
	if err != nil {
		return err
	}
	rc, known, err := ds.untrack(ds.allocs, ptr, func() C.int { return C.b2b_mem_free(d.tab, C.CUdeviceptr(ptr)) })
	if err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("%w: gpudirect: cuMemFree_v2(%#x) on device %d: not an allocation made by MemAlloc", ErrInvalidValue, ptr, dev)
	}
	return d.callErr(rc, dev, "cuMemFree_v2(%#x)", ptr)
}

func (d *driver) PointerInfo(dev int, ptr uintptr) (PointerInfo, error) {
	ds, err := d.device(dev)
	if err != nil {
		return PointerInfo{}, err
	}
	var (
		rc   C.int
		info PointerInfo
	)
	if err := ds.w.do(func() {
		var v C.ulonglong
		if rc = C.b2b_ptr_attr(d.tab, C.CUdeviceptr(ptr), C.B2B_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, &v); rc != 0 {
			return
		}
		info.MemoryType = MemoryType(v)
		// The other attributes are best effort: an older driver may lack one.
		if C.b2b_ptr_attr(d.tab, C.CUdeviceptr(ptr), C.B2B_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, &v) == 0 {
			info.Device = int(int32(uint32(v)))
		} else {
			info.Device = -1
		}
		if C.b2b_ptr_attr(d.tab, C.CUdeviceptr(ptr), C.B2B_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, &v) == 0 {
			info.RangeStart = uintptr(v)
		}
		if C.b2b_ptr_attr(d.tab, C.CUdeviceptr(ptr), C.B2B_CU_POINTER_ATTRIBUTE_RANGE_SIZE, &v) == 0 {
			info.RangeSize = uint64(v)
		}
		if C.b2b_ptr_attr(d.tab, C.CUdeviceptr(ptr), C.B2B_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, &v) == 0 {
			info.SyncMemops = uint32(v) != 0
		}
		if C.b2b_ptr_attr(d.tab, C.CUdeviceptr(ptr), C.B2B_CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, &v) == 0 {
			info.GPUDirectRDMACapable = uint32(v) != 0
		}
	}); err != nil {
		return PointerInfo{}, err
	}
	if err := d.callErr(rc, dev, "cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, %#x)", ptr); err != nil {
		if is(rc, ErrorInvalidValue) {
			return PointerInfo{}, fmt.Errorf("address %#x is not memory CUDA knows: %w", ptr, err)
		}
		return PointerInfo{}, err
	}
	return info, nil
}

func (d *driver) SetSyncMemops(dev int, ptr uintptr) error {
	ds, err := d.device(dev)
	if err != nil {
		return err
	}
	var rc C.int
	if err := ds.w.do(func() { rc = C.b2b_set_sync_memops(d.tab, C.CUdeviceptr(ptr)) }); err != nil {
		return err
	}
	return d.callErr(rc, dev, "cuPointerSetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS=1, %#x)", ptr)
}

func (d *driver) ExportDmabuf(dev int, ptr uintptr, size uint64, flags DmabufFlags) (*Dmabuf, error) {
	if err := d.checkDev(dev); err != nil {
		return nil, err
	}
	if !d.caps.DmabufExport {
		return nil, fmt.Errorf("%w: gpudirect: the CUDA driver (version %d) has no cuMemGetHandleForAddressRange; dma-buf export needs CUDA 11.7 or later", ErrNotSupported, d.version)
	}
	if !d.infos[dev].DmabufSupported {
		return nil, fmt.Errorf("%w: gpudirect: device %d (%s) reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED=0: dma-buf export needs NVIDIA's open kernel modules and Linux 5.12 or later", ErrNotSupported, dev, d.infos[dev].Name)
	}
	base, length, off, ok := AlignRange(ptr, size, d.pageSize)
	if !ok {
		return nil, fmt.Errorf("%w: gpudirect: dma-buf export of [%#x, +%d) on device %d: empty or overflowing range", ErrInvalidValue, ptr, size, dev)
	}
	ds, err := d.device(dev)
	if err != nil {
		return nil, err
	}
	var (
		fd       C.int
		rc, rc2  C.int
		abase    C.CUdeviceptr
		asize    C.size_t
		fellBack bool
	)
	if err := ds.w.do(func() {
		rc = C.b2b_dmabuf_export(d.tab, C.CUdeviceptr(base), C.size_t(length), C.ulonglong(flags), &fd)
		if !is(rc, ErrorInvalidValue) {
			return
		}
		// Should the driver refuse a sub-range, export the whole
		// allocation: ibv_reg_dmabuf_mr takes an offset into it anyway.
		if rc2 = C.b2b_addr_range(d.tab, C.CUdeviceptr(ptr), &abase, &asize); rc2 != 0 {
			return
		}
		if uint64(abase)%d.pageSize != 0 || uint64(asize)%d.pageSize != 0 || (uintptr(abase) == base && uint64(asize) == length) {
			return
		}
		var fd2 C.int
		if C.b2b_dmabuf_export(d.tab, abase, asize, C.ulonglong(flags), &fd2) == 0 {
			fd, rc, fellBack = fd2, 0, true
		}
	}); err != nil {
		return nil, err
	}
	if err := d.callErr(rc, dev, "cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, ptr=%#x, size=%d, flags=%#x) for [%#x, +%d)", base, length, uint64(flags), ptr, size); err != nil {
		return nil, err
	}
	if fellBack {
		base, length, off = uintptr(abase), uint64(asize), uint64(ptr)-uint64(abase)
	}
	return NewDmabuf(int(fd), base, length, off, syscall.Close), nil
}

// ---- IPC -----------------------------------------------------------------------

func (d *driver) IPCGetMemHandle(dev int, ptr uintptr) (IPCHandle, error) {
	var h IPCHandle
	ds, err := d.device(dev)
	if err != nil {
		return h, err
	}
	var rc C.int
	if err := ds.w.do(func() { rc = C.b2b_ipc_get(d.tab, C.CUdeviceptr(ptr), unsafe.Pointer(&h[0])) }); err != nil {
		return IPCHandle{}, err
	}
	if err := d.callErr(rc, dev, "cuIpcGetMemHandle(%#x)", ptr); err != nil {
		return IPCHandle{}, err
	}
	return h, nil
}

func (d *driver) IPCOpenMemHandle(dev int, h IPCHandle) (uintptr, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	if h == (IPCHandle{}) {
		return 0, fmt.Errorf("%w: gpudirect: cuIpcOpenMemHandle_v2 on device %d: IPC handle is all zeros", ErrInvalidValue, dev)
	}
	ds, err := d.device(dev)
	if err != nil {
		return 0, err
	}
	var p C.CUdeviceptr
	var rc C.int
	if err := ds.w.do(func() {
		if rc = C.b2b_ipc_open(d.tab, unsafe.Pointer(&h[0]), &p); rc == 0 {
			ds.ipcOpen[uintptr(p)]++
		}
	}); err != nil {
		return 0, err
	}
	if err := d.callErr(rc, dev, "cuIpcOpenMemHandle_v2(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)"); err != nil {
		return 0, err
	}
	return uintptr(p), nil
}

func (d *driver) IPCCloseMemHandle(dev int, ptr uintptr) error {
	ds, err := d.device(dev)
	if err != nil {
		return err
	}
	var rc C.int
	known := true
	if err := ds.w.do(func() {
		if _, known = ds.ipcOpen[ptr]; !known {
			return
		}
		rc = C.b2b_ipc_close(d.tab, C.CUdeviceptr(ptr))
		if ds.ipcOpen[ptr]--; ds.ipcOpen[ptr] <= 0 {
			delete(ds.ipcOpen, ptr)
		}
	}); err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("%w: gpudirect: cuIpcCloseMemHandle(%#x) on device %d: not a mapping made by IPCOpenMemHandle", ErrInvalidValue, ptr, dev)
	}
	return d.callErr(rc, dev, "cuIpcCloseMemHandle(%#x)", ptr)
}
