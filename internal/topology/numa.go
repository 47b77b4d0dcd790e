package topology

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MemoryNode is the NUMA node holding the page at addr, asked of the
// kernel with move_pages(2) in query mode (nodes == NULL). A page not yet
// faulted in has no node: -1, as on kernels without NUMA.
func MemoryNode(addr uintptr) (int, error) {
	page := addr &^ uintptr(unix.Getpagesize()-1)
	status := int32(-1)
	_, _, e := unix.Syscall6(unix.SYS_MOVE_PAGES, 0, 1, uintptr(unsafe.Pointer(&page)), 0, uintptr(unsafe.Pointer(&status)), 0)
	if e != 0 {
		return -1, fmt.Errorf("topology: move_pages(query %#x): %w", page, e)
	}
	if status < 0 {
		return -1, nil
	}
	return int(status), nil
}
