//go:build !cgo || !linux

package verbs

import (
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
)

// errUnavailable is what every stub returns: this binary has no verbs.
var errUnavailable = fmt.Errorf("verbs: built without cgo (or not on Linux); rebuild with CGO_ENABLED=1 for RDMA: %w", errs.ErrUnavailable)

// Load reports that verbs is not compiled in.
func Load() error { return errUnavailable }

// Compiled reports whether this binary has the cgo verbs implementation.
func Compiled() bool { return false }

// ListDevices is unavailable without cgo.
func ListDevices() ([]string, error) { return nil, errUnavailable }

// Context is an open device (stub).
type Context struct{}

// Open is unavailable without cgo.
func Open(name string) (*Context, error) { return nil, errUnavailable }

func (c *Context) Name() string                          { return "" }
func (c *Context) Attr() DeviceAttr                      { return DeviceAttr{} }
func (c *Context) QueryPort(port int) (PortAttr, error)  { return PortAttr{}, errUnavailable }
func (c *Context) QueryGID(port, index int) (GID, error) { return GID{}, errUnavailable }
func (c *Context) AsyncFD() int                          { return -1 }
func (c *Context) DrainAsync(out []AsyncEvent) int       { return 0 }
func (c *Context) AllocPD() (*PD, error)                 { return nil, errUnavailable }
func (c *Context) NewCompChannel() (*CompChannel, error) { return nil, errUnavailable }
func (c *Context) NewCQ(cqe int, ch *CompChannel) (*CQ, error) {
	return nil, errUnavailable
}
func (c *Context) Close() error { return nil }

// EventString names an async event type.
func EventString(t int) string { return fmt.Sprintf("event(%d)", t) }

// StatusString names a WC status.
func StatusString(s WCStatus) string { return fmt.Sprintf("status(%d)", uint32(s)) }

// PD is a protection domain (stub).
type PD struct{}

func (pd *PD) RegMR(addr uintptr, n uint64, access Access) (*MR, error) { return nil, errUnavailable }
func (pd *PD) RegDmabufMR(fd int, offset, n, iova uint64, access Access) (*MR, error) {
	return nil, errUnavailable
}
func (pd *PD) NewSRQ(maxWR, maxSGE int) (*SRQ, error) { return nil, errUnavailable }
func (pd *PD) NewRCQP(cfg QPConfig) (*QP, error)      { return nil, errUnavailable }
func (pd *PD) Close() error                           { return nil }

// MR is a memory region (stub).
type MR struct{}

func (m *MR) Addr() uint64 { return 0 }
func (m *MR) Len() uint64  { return 0 }
func (m *MR) LKey() uint32 { return 0 }
func (m *MR) RKey() uint32 { return 0 }
func (m *MR) Close() error { return nil }

// CompChannel is a completion channel (stub).
type CompChannel struct{}

func (ch *CompChannel) FD() int          { return -1 }
func (ch *CompChannel) DrainEvents() int { return 0 }
func (ch *CompChannel) Close() error     { return nil }

// CQ is a completion queue (stub).
type CQ struct{}

func (cq *CQ) Depth() int                 { return 0 }
func (cq *CQ) Arm() error                 { return errUnavailable }
func (cq *CQ) Poll(b *WCBuf) (int, error) { return 0, errUnavailable }
func (cq *CQ) Close() error               { return nil }

// WCBuf is a poll buffer (stub).
type WCBuf struct{}

// NewWCBuf is unavailable without cgo.
func NewWCBuf(n int) (*WCBuf, error) { return nil, errUnavailable }
func (b *WCBuf) At(i int) WC         { return WC{} }
func (b *WCBuf) Close() error        { return nil }

// SRQ is a shared receive queue (stub).
type SRQ struct{}

func (s *SRQ) PostRecv(idx []uint32, base uint64, bufLen, lkey uint32) error { return errUnavailable }
func (s *SRQ) Close() error                                                  { return nil }

// QPConfig describes an RC QP.
type QPConfig struct {
	SendCQ, RecvCQ *CQ
	SRQ            *SRQ
	MaxSendWR      int
	MaxSendSGE     int
	MaxInline      int
}

// QPCaps is what the provider granted.
type QPCaps struct {
	MaxSendWR, MaxSendSGE, MaxInline int
}

// RTRAttr is the remote side as INIT→RTR needs it.
type RTRAttr struct {
	Port        int
	RemoteQPN   uint32
	RemotePSN   uint32
	MTU         MTU
	Global      bool
	RemoteGID   GID
	GIDIndex    int
	RemoteLID   uint16
	MinRNRTimer int
}

// RTSAttr is what RTR → RTS needs.
type RTSAttr struct {
	PSN        uint32
	Timeout    int
	RetryCount int
	RNRRetry   int
}

// QP is a queue pair (stub).
type QP struct{}

func (q *QP) Num() uint32                          { return 0 }
func (q *QP) Caps() QPCaps                         { return QPCaps{} }
func (q *QP) ToInit(port int, access Access) error { return errUnavailable }
func (q *QP) ToRTR(a RTRAttr) error                { return errUnavailable }
func (q *QP) ToRTS(a RTSAttr) error                { return errUnavailable }
func (q *QP) ToError() error                       { return errUnavailable }
func (q *QP) State() (int, error)                  { return 0, errUnavailable }
func (q *QP) Close() error                         { return nil }
func (q *QP) PostSend(wrID uint64, op WROpcode, imm uint32, addr uint64, n, lkey uint32, signaled bool) error {
	return errUnavailable
}

// HostMem is C memory (stub).
type HostMem struct{}

// AllocHost is unavailable without cgo.
func AllocHost(n int) (*HostMem, error) { return nil, errUnavailable }
func (h *HostMem) Addr() uintptr        { return 0 }
func (h *HostMem) Bytes() []byte        { return nil }
func (h *HostMem) Free()                {}
