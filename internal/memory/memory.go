// Package memory describes a block of registered memory as the transports see
// it: host RAM mapped from a shared-memory file, or GPU HBM.
package memory

import "fmt"

// Kind says where the bytes live.
type Kind int

const (
	Host Kind = iota + 1
	CUDA
)

func (k Kind) String() string {
	switch k {
	case Host:
		return "host"
	case CUDA:
		return "cuda"
	default:
		return fmt.Sprintf("kind(%d)", int(k))
	}
}

// Memory is one contiguous range. It never points into the Go heap: host
// memory is mmap'd, CUDA memory is a device pointer.
type Memory struct {
	Kind Kind
	// Addr is the base virtual address (host VA or CUDA device pointer).
	Addr uintptr
	Len  uint64
	// Host is the byte view of host memory; nil for CUDA memory.
	Host []byte
	// Device is the CUDA ordinal for CUDA memory.
	Device int
	// DmabufFD exports CUDA memory for ibv_reg_dmabuf_mr; -1 when none.
	DmabufFD int
	// DmabufOffset is Addr's offset inside the dma-buf.
	DmabufOffset uint64
}
