package gpudirect

import (
	"fmt"
	"sync"
)

// Sharing device memory with another process on the same host (the
// same-host transport): the receiver hands the sender an IPC handle of the
// allocation that holds its region, and the region's offset inside it.
// Memory the daemon allocated has its own handle (cuIpcGetMemHandle);
// memory the daemon itself opened from an application's handle
// (Regions.Import) cannot be re-exported by the driver, so the handle it was
// opened with is remembered here and handed on instead.

type importKey struct {
	owner Interface
	dev   int
	base  uintptr
}

var imports sync.Map // importKey -> IPCHandle

func rememberImport(c Interface, dev int, base uintptr, h IPCHandle) {
	imports.Store(importKey{c, dev, base}, h)
}

func forgetImport(c Interface, dev int, base uintptr) {
	imports.Delete(importKey{c, dev, base})
}

// ShareHandle returns an IPC handle another process can open to reach
// [ptr, ptr+size) on dev, and ptr's offset from the start of the memory the
// handle maps. ptr must be device memory of dev.
func ShareHandle(c Interface, dev int, ptr uintptr, size uint64) (IPCHandle, uint64, error) {
	if err := CheckDeviceMemory(c, dev, ptr, size); err != nil {
		return IPCHandle{}, 0, err
	}
	pi, err := c.PointerInfo(dev, ptr)
	if err != nil {
		return IPCHandle{}, 0, err
	}
	base := pi.RangeStart
	if base == 0 || ptr < base {
		return IPCHandle{}, 0, fmt.Errorf("%w: gpudirect: the driver gives no allocation start for %#x", ErrInvalidValue, ptr)
	}
	if v, ok := imports.Load(importKey{c, dev, base}); ok {
		return v.(IPCHandle), uint64(ptr - base), nil
	}
	h, err := c.IPCGetMemHandle(dev, base)
	if err != nil {
		return IPCHandle{}, 0, fmt.Errorf("gpudirect: share %#x on device %d: %w", ptr, dev, err)
	}
	return h, uint64(ptr - base), nil
}
