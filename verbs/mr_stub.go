//go:build !cgo || !linux

package verbs

// PD is a protection domain (stub).
type PD struct{}

func (c *Context) AllocPD() (*PD, error) { return nil, errUnavailable }

func (pd *PD) RegMR(addr uintptr, n uint64, access Access) (*MR, error) { return nil, errUnavailable }
func (pd *PD) RegDmabufMR(fd int, offset, n, iova uint64, access Access) (*MR, error) {
	return nil, errUnavailable
}
func (pd *PD) Close() error { return nil }

// MR is a memory region (stub).
type MR struct{}

func (m *MR) Addr() uint64 { return 0 }
func (m *MR) Len() uint64  { return 0 }
func (m *MR) LKey() uint32 { return 0 }
func (m *MR) RKey() uint32 { return 0 }
func (m *MR) Close() error { return nil }
