//go:build cgo && linux

package verbs

/*
#cgo CFLAGS: -O2 -Wall -Wno-unused-function
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "b2b.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
)

var (
	loadOnce sync.Once
	loadErr  error
)

// Load dlopens libibverbs once. It returns an error wrapping
// errs.ErrUnavailable when the library or one of its symbols is missing.
func Load() error {
	loadOnce.Do(func() {
		var buf [512]C.char
		if C.b2b_load(&buf[0], C.size_t(len(buf))) != 0 {
			loadErr = fmt.Errorf("verbs: %s: %w", C.GoString(&buf[0]), errs.ErrUnavailable)
		}
	})
	return loadErr
}

// Compiled reports whether this binary has the cgo verbs implementation.
func Compiled() bool { return true }

// ListDevices names the devices libibverbs can open.
func ListDevices() ([]string, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	var n C.int
	l, errno := C.b2b_get_device_list(&n)
	if l == nil {
		return nil, deviceListErr(errno)
	}
	defer C.b2b_free_device_list(l)
	devs := unsafe.Slice(l, int(n))
	names := make([]string, 0, len(devs))
	for _, d := range devs {
		names = append(names, C.GoString(C.b2b_device_name(d)))
	}
	return names, nil
}

func deviceListErr(errno error) error {
	hint := ""
	if errors.Is(errno, syscall.ENOSYS) {
		hint = " (the kernel exposes no RDMA devices: load the NIC's driver, or add a Soft-RoCE link with `rdma link add rxe0 type rxe netdev IF`)"
	}
	return fmt.Errorf("verbs: ibv_get_device_list: %w%s: %w", errno, hint, errs.ErrUnavailable)
}

// children counts open child handles so a parent refuses to close first.
type children struct{ n atomic.Int32 }

func (c *children) busy(what string) error {
	if n := c.n.Load(); n > 0 {
		return fmt.Errorf("verbs: close %s: %d child handle(s) still open (close QPs, CQs, SRQs, MRs first): %w",
			what, n, errs.ErrFailedPrecondition)
	}
	return nil
}

// Context is an open device (ibv_context).
type Context struct {
	c     *C.struct_ibv_context
	name  string
	attr  DeviceAttr
	kids  children
	async [16]C.struct_b2b_async
}

// Open opens the named device ("" = the first one).
func Open(name string) (*Context, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	var n C.int
	l, errno := C.b2b_get_device_list(&n)
	if l == nil {
		return nil, deviceListErr(errno)
	}
	defer C.b2b_free_device_list(l)
	devs := unsafe.Slice(l, int(n))
	if len(devs) == 0 {
		return nil, fmt.Errorf("verbs: no RDMA device found (is rdma-core's provider for the NIC installed, or an rxe link added?): %w", errs.ErrUnavailable)
	}
	var dev *C.struct_ibv_device
	var seen []string
	for _, d := range devs {
		dn := C.GoString(C.b2b_device_name(d))
		seen = append(seen, dn)
		if name == "" || dn == name {
			dev, name = d, dn
			break
		}
	}
	if dev == nil {
		return nil, fmt.Errorf("verbs: device %q not found (have %v): %w", name, seen, errs.ErrUnavailable)
	}
	c, errno := C.b2b_open_device(dev)
	if c == nil {
		return nil, fmt.Errorf("verbs: ibv_open_device(%s): %w (%w)", name, errno, errs.ErrUnavailable)
	}
	ctx := &Context{c: c, name: name}
	var a C.struct_ibv_device_attr
	if rc := C.b2b_query_device(c, &a); rc != 0 {
		C.b2b_close_device(c)
		return nil, fmt.Errorf("verbs: ibv_query_device(%s): %w", name, syscall.Errno(rc))
	}
	ctx.attr = DeviceAttr{
		FWVersion:  C.GoString(&a.fw_ver[0]),
		VendorID:   uint32(a.vendor_id),
		PartID:     uint32(a.vendor_part_id),
		MaxMRSize:  uint64(a.max_mr_size),
		MaxQP:      int(a.max_qp),
		MaxQPWR:    int(a.max_qp_wr),
		MaxSGE:     int(a.max_sge),
		MaxCQ:      int(a.max_cq),
		MaxCQE:     int(a.max_cqe),
		MaxMR:      int(a.max_mr),
		MaxSRQ:     int(a.max_srq),
		MaxSRQWR:   int(a.max_srq_wr),
		MaxSRQSGE:  int(a.max_srq_sge),
		PhysPorts:  int(a.phys_port_cnt),
		MaxQPRdAtm: int(a.max_qp_rd_atom),
	}
	if err := setNonblock(C.b2b_async_fd(c), "async fd"); err != nil {
		C.b2b_close_device(c)
		return nil, err
	}
	return ctx, nil
}

func setNonblock(fd C.int, what string) error {
	if rc := C.b2b_set_nonblock(fd); rc != 0 {
		return fmt.Errorf("verbs: set %s non-blocking: %w", what, syscall.Errno(-rc))
	}
	return nil
}

// Name is the device name, e.g. "mlx5_0" or "rxe0".
func (c *Context) Name() string { return c.name }

// Attr is the device's capabilities.
func (c *Context) Attr() DeviceAttr { return c.attr }

// QueryPort reads a port's attributes.
func (c *Context) QueryPort(port int) (PortAttr, error) {
	if c.c == nil {
		return PortAttr{}, errClosed("context")
	}
	var a C.struct_ibv_port_attr
	if rc := C.b2b_query_port(c.c, C.uint8_t(port), &a); rc != 0 {
		return PortAttr{}, fmt.Errorf("verbs: ibv_query_port(%s, %d): %w", c.name, port, syscall.Errno(rc))
	}
	return PortAttr{
		State:       PortState(a.state),
		MaxMTU:      MTU(a.max_mtu),
		ActiveMTU:   MTU(a.active_mtu),
		GIDTableLen: int(a.gid_tbl_len),
		MaxMsgSize:  uint32(a.max_msg_sz),
		LID:         uint16(a.lid),
		LinkLayer:   LinkLayer(a.link_layer),
	}, nil
}

// QueryGID reads one GID table entry.
func (c *Context) QueryGID(port, index int) (GID, error) {
	var g GID
	if c.c == nil {
		return g, errClosed("context")
	}
	var raw [16]C.uint8_t
	if rc := C.b2b_query_gid(c.c, C.uint8_t(port), C.int(index), &raw[0]); rc != 0 {
		return g, fmt.Errorf("verbs: ibv_query_gid(%s, port %d, index %d): %w", c.name, port, index, syscall.Errno(rc))
	}
	for k := range raw {
		g[k] = byte(raw[k])
	}
	return g, nil
}

// AsyncFD is the non-blocking fd that becomes readable on async events.
func (c *Context) AsyncFD() int {
	if c.c == nil {
		return -1
	}
	return int(C.b2b_async_fd(c.c))
}

// DrainAsync reads (and acknowledges) pending async events into out and
// returns how many it stored.
func (c *Context) DrainAsync(out []AsyncEvent) int {
	if c.c == nil || len(out) == 0 {
		return 0
	}
	m := len(out)
	if m > len(c.async) {
		m = len(c.async)
	}
	n := int(C.b2b_drain_async(c.c, &c.async[0], C.int(m)))
	for k := 0; k < n; k++ {
		a := &c.async[k]
		out[k] = AsyncEvent{Type: int(a._type), QPNum: uint32(a.qp_num), Port: int(a.port)}
	}
	return n
}

// EventString names an async event type.
func EventString(t int) string {
	if Load() != nil {
		return fmt.Sprintf("event(%d)", t)
	}
	return C.GoString(C.b2b_event_type_str(C.int(t)))
}

// StatusString is ibv_wc_status_str.
func StatusString(s WCStatus) string {
	if Load() != nil {
		return fmt.Sprintf("status(%d)", uint32(s))
	}
	return C.GoString(C.b2b_wc_status_str(C.int(s)))
}

// Close closes the device; every child must be closed first.
func (c *Context) Close() error {
	if c == nil || c.c == nil {
		return nil
	}
	if err := c.kids.busy("context " + c.name); err != nil {
		return err
	}
	if rc := C.b2b_close_device(c.c); rc != 0 {
		return fmt.Errorf("verbs: ibv_close_device(%s): %w", c.name, syscall.Errno(rc))
	}
	c.c = nil
	return nil
}

func errClosed(what string) error {
	return fmt.Errorf("verbs: %s is closed: %w", what, errs.ErrFailedPrecondition)
}

// PD is a protection domain.
type PD struct {
	p      *C.struct_ibv_pd
	parent *Context
	kids   children
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	if c.c == nil {
		return nil, errClosed("context")
	}
	p, errno := C.b2b_alloc_pd(c.c)
	if p == nil {
		return nil, fmt.Errorf("verbs: ibv_alloc_pd(%s): %w", c.name, errno)
	}
	c.kids.n.Add(1)
	return &PD{p: p, parent: c}, nil
}

// Close deallocates the PD; its MRs, SRQs and QPs must be closed first.
func (pd *PD) Close() error {
	if pd == nil || pd.p == nil {
		return nil
	}
	if err := pd.kids.busy("PD"); err != nil {
		return err
	}
	if rc := C.b2b_dealloc_pd(pd.p); rc != 0 {
		return fmt.Errorf("verbs: ibv_dealloc_pd: %w", syscall.Errno(rc))
	}
	pd.p = nil
	pd.parent.kids.n.Add(-1)
	return nil
}

// MR is a registered memory region.
type MR struct {
	m      *C.struct_ibv_mr
	parent *PD
	addr   uint64 // the address WRs use: VA for reg_mr, iova for dma-buf
	length uint64
	lkey   uint32
	rkey   uint32
}

// RegMR registers [addr, addr+n) of host (or peer-mapped GPU) memory. The
// memory must not be Go heap memory. EPERM/ENOMEM map to
// errs.ErrResourceExhausted with a hint about the locked-memory limit.
func (pd *PD) RegMR(addr uintptr, n uint64, access Access) (*MR, error) {
	if pd.p == nil {
		return nil, errClosed("PD")
	}
	if addr == 0 || n == 0 {
		return nil, fmt.Errorf("verbs: ibv_reg_mr(addr=%#x, len=%d): empty range: %w", addr, n, errs.ErrInvalidArgument)
	}
	m, errno := C.b2b_reg_mr(pd.p, C.uintptr_t(addr), C.size_t(n), C.int(access))
	if m == nil {
		return nil, regErr(fmt.Sprintf("ibv_reg_mr(addr=%#x, len=%d)", addr, n), errno)
	}
	pd.kids.n.Add(1)
	return &MR{m: m, parent: pd, addr: uint64(addr), length: n, lkey: uint32(m.lkey), rkey: uint32(m.rkey)}, nil
}

// RegDmabufMR registers n bytes at offset of a dma-buf (GPU memory exported
// by the CUDA driver); WRs address it by iova.
func (pd *PD) RegDmabufMR(fd int, offset, n, iova uint64, access Access) (*MR, error) {
	if pd.p == nil {
		return nil, errClosed("PD")
	}
	if C.b2b_have_dmabuf() == 0 {
		return nil, fmt.Errorf("verbs: ibv_reg_dmabuf_mr: this libibverbs lacks it (rdma-core >= 34 needed; alternatively nvidia-peermem lets ibv_reg_mr take GPU pointers): %w", errs.ErrUnavailable)
	}
	if fd < 0 || n == 0 {
		return nil, fmt.Errorf("verbs: ibv_reg_dmabuf_mr(fd=%d, len=%d): %w", fd, n, errs.ErrInvalidArgument)
	}
	m, errno := C.b2b_reg_dmabuf_mr(pd.p, C.uint64_t(offset), C.size_t(n), C.uint64_t(iova), C.int(fd), C.int(access))
	if m == nil {
		what := fmt.Sprintf("ibv_reg_dmabuf_mr(fd=%d, offset=%d, len=%d)", fd, offset, n)
		if en, ok := errno.(syscall.Errno); ok && (en == syscall.EOPNOTSUPP || en == syscall.ENOSYS || en == syscall.EPROTONOSUPPORT) {
			return nil, fmt.Errorf("verbs: %s: %w: the device/driver has no dma-buf support (needs a NIC such as ConnectX with a kernel >= 5.12 and the GPU driver's dma-buf export; nvidia-peermem is the other route): %w",
				what, en, errs.ErrUnavailable)
		}
		return nil, regErr(what, errno)
	}
	pd.kids.n.Add(1)
	return &MR{m: m, parent: pd, addr: iova, length: n, lkey: uint32(m.lkey), rkey: uint32(m.rkey)}, nil
}

// regErr classifies a registration failure.
func regErr(what string, errno error) error {
	var en syscall.Errno
	if errors.As(errno, &en) && (en == syscall.EPERM || en == syscall.ENOMEM || en == syscall.EAGAIN) {
		var lim unix.Rlimit
		cur := "unknown"
		if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) == nil {
			if lim.Cur == unix.RLIM_INFINITY {
				cur = "unlimited"
			} else {
				cur = fmt.Sprintf("%d KiB", lim.Cur/1024)
			}
		}
		return fmt.Errorf("verbs: %s: %w: cannot pin memory (locked-memory limit is %s; raise it with `ulimit -l unlimited`, LimitMEMLOCK=infinity in the systemd unit, or --ulimit memlock=-1 for containers): %w",
			what, en, cur, errs.ErrResourceExhausted)
	}
	if errors.As(errno, &en) && en == syscall.EFAULT {
		return fmt.Errorf("verbs: %s: %w: the range is not mapped memory the kernel can pin (GPU memory needs dma-buf or nvidia-peermem): %w", what, en, errs.ErrInvalidArgument)
	}
	return fmt.Errorf("verbs: %s: %w", what, errno)
}

// Addr is the address WRs use for offset 0 of the region.
func (m *MR) Addr() uint64 { return m.addr }

// Len is the registered length.
func (m *MR) Len() uint64 { return m.length }

// LKey is the local key.
func (m *MR) LKey() uint32 { return m.lkey }

// RKey is the remote key.
func (m *MR) RKey() uint32 { return m.rkey }

// Close deregisters the region.
func (m *MR) Close() error {
	if m == nil || m.m == nil {
		return nil
	}
	if rc := C.b2b_dereg_mr(m.m); rc != 0 {
		return fmt.Errorf("verbs: ibv_dereg_mr(len=%d): %w", m.length, syscall.Errno(rc))
	}
	m.m = nil
	m.parent.kids.n.Add(-1)
	return nil
}

// CompChannel is a completion channel; its fd is non-blocking.
type CompChannel struct {
	ch     *C.struct_ibv_comp_channel
	parent *Context
	kids   children
}

// NewCompChannel creates a completion channel.
func (c *Context) NewCompChannel() (*CompChannel, error) {
	if c.c == nil {
		return nil, errClosed("context")
	}
	ch, errno := C.b2b_create_comp_channel(c.c)
	if ch == nil {
		return nil, fmt.Errorf("verbs: ibv_create_comp_channel(%s): %w", c.name, errno)
	}
	if err := setNonblock(C.b2b_comp_fd(ch), "completion channel"); err != nil {
		C.b2b_destroy_comp_channel(ch)
		return nil, err
	}
	c.kids.n.Add(1)
	return &CompChannel{ch: ch, parent: c}, nil
}

// FD is the channel's fd, readable when an armed CQ has a completion.
func (ch *CompChannel) FD() int {
	if ch.ch == nil {
		return -1
	}
	return int(C.b2b_comp_fd(ch.ch))
}

// DrainEvents reads and acknowledges every pending CQ event.
func (ch *CompChannel) DrainEvents() int {
	if ch.ch == nil {
		return 0
	}
	return int(C.b2b_drain_cq_events(ch.ch))
}

// Close destroys the channel; its CQs must be closed first.
func (ch *CompChannel) Close() error {
	if ch == nil || ch.ch == nil {
		return nil
	}
	if err := ch.kids.busy("completion channel"); err != nil {
		return err
	}
	if rc := C.b2b_destroy_comp_channel(ch.ch); rc != 0 {
		return fmt.Errorf("verbs: ibv_destroy_comp_channel: %w", syscall.Errno(rc))
	}
	ch.ch = nil
	ch.parent.kids.n.Add(-1)
	return nil
}

// CQ is a completion queue.
type CQ struct {
	cq      *C.struct_ibv_cq
	parent  *Context
	channel *CompChannel
	depth   int
	kids    children
}

// NewCQ creates a CQ of at least cqe entries, bound to ch (may be nil).
func (c *Context) NewCQ(cqe int, ch *CompChannel) (*CQ, error) {
	if c.c == nil {
		return nil, errClosed("context")
	}
	if cqe <= 0 || (c.attr.MaxCQE > 0 && cqe > c.attr.MaxCQE) {
		return nil, fmt.Errorf("verbs: ibv_create_cq(cqe=%d): device allows 1..%d: %w", cqe, c.attr.MaxCQE, errs.ErrInvalidArgument)
	}
	var cch *C.struct_ibv_comp_channel
	if ch != nil {
		cch = ch.ch
	}
	cq, errno := C.b2b_create_cq(c.c, C.int(cqe), cch)
	if cq == nil {
		return nil, fmt.Errorf("verbs: ibv_create_cq(cqe=%d): %w", cqe, errno)
	}
	c.kids.n.Add(1)
	if ch != nil {
		ch.kids.n.Add(1)
	}
	return &CQ{cq: cq, parent: c, channel: ch, depth: int(cq.cqe)}, nil
}

// Depth is the CQ's real size.
func (cq *CQ) Depth() int { return cq.depth }

// Arm requests an event for the next completion (ibv_req_notify_cq).
func (cq *CQ) Arm() error {
	if cq == nil || cq.cq == nil {
		return fmt.Errorf("verbs: ibv_req_notify_cq on a destroyed CQ: %w", syscall.EBADF)
	}
	if rc := C.b2b_arm(cq.cq); rc != 0 {
		return fmt.Errorf("verbs: ibv_req_notify_cq: %w", syscall.Errno(rc))
	}
	return nil
}

// Poll moves up to b's capacity of completions into b; it returns how many.
func (cq *CQ) Poll(b *WCBuf) (int, error) {
	if cq == nil || cq.cq == nil {
		return 0, fmt.Errorf("verbs: ibv_poll_cq on a destroyed CQ: %w", syscall.EBADF)
	}
	n := int(C.b2b_poll(cq.cq, b.b))
	if n < 0 {
		return 0, fmt.Errorf("verbs: ibv_poll_cq: %w", syscall.Errno(-n))
	}
	return n, nil
}

// Close destroys the CQ; its QPs must be closed first.
func (cq *CQ) Close() error {
	if cq == nil || cq.cq == nil {
		return nil
	}
	if err := cq.kids.busy("CQ"); err != nil {
		return err
	}
	if rc := C.b2b_destroy_cq(cq.cq); rc != 0 {
		return fmt.Errorf("verbs: ibv_destroy_cq: %w", syscall.Errno(rc))
	}
	cq.cq = nil
	cq.parent.kids.n.Add(-1)
	if cq.channel != nil {
		cq.channel.kids.n.Add(-1)
	}
	return nil
}

// WCBuf is a reusable, C-allocated poll buffer.
type WCBuf struct {
	b   *C.struct_b2b_wcbuf
	wcs []C.struct_b2b_wc
}

// NewWCBuf allocates room for n completions per poll.
func NewWCBuf(n int) (*WCBuf, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("verbs: WC buffer of %d: %w", n, errs.ErrInvalidArgument)
	}
	b := C.b2b_wcbuf_new(C.int(n))
	if b == nil {
		return nil, fmt.Errorf("verbs: WC buffer of %d: %w", n, syscall.ENOMEM)
	}
	return &WCBuf{b: b, wcs: unsafe.Slice(b.wc, n)}, nil
}

// At returns completion i of the last poll.
func (b *WCBuf) At(i int) WC {
	w := &b.wcs[i]
	return WC{
		WRID: uint64(w.wr_id), Status: WCStatus(w.status), Opcode: WCOpcode(w.opcode),
		QPNum: uint32(w.qp_num), Imm: uint32(w.imm), ByteLen: uint32(w.byte_len),
		VendorErr: uint32(w.vendor_err), Flags: uint32(w.flags),
	}
}

// Close frees the buffer.
func (b *WCBuf) Close() error {
	if b != nil && b.b != nil {
		C.b2b_wcbuf_free(b.b)
		b.b, b.wcs = nil, nil
	}
	return nil
}

// SRQ is a shared receive queue.
type SRQ struct {
	s      *C.struct_ibv_srq
	parent *PD
	maxWR  int
	kids   children
}

// NewSRQ creates an SRQ of maxWR receives with maxSGE SGEs each.
func (pd *PD) NewSRQ(maxWR, maxSGE int) (*SRQ, error) {
	if pd.p == nil {
		return nil, errClosed("PD")
	}
	s, errno := C.b2b_create_srq(pd.p, C.uint32_t(maxWR), C.uint32_t(maxSGE))
	if s == nil {
		return nil, fmt.Errorf("verbs: ibv_create_srq(max_wr=%d, max_sge=%d): %w", maxWR, maxSGE, errno)
	}
	pd.kids.n.Add(1)
	return &SRQ{s: s, parent: pd, maxWR: maxWR}, nil
}

// PostRecv posts one receive per idx entry: buffer x is
// [base + x*bufLen, +bufLen) under lkey and its wr_id is x. idx must not
// be empty and must not be Go-pointer-bearing (a []uint32 is fine).
func (s *SRQ) PostRecv(idx []uint32, base uint64, bufLen, lkey uint32) error {
	if len(idx) == 0 {
		return nil
	}
	if rc := C.b2b_srq_post(s.s, (*C.uint32_t)(unsafe.Pointer(&idx[0])), C.int(len(idx)), C.uint64_t(base), C.uint32_t(bufLen), C.uint32_t(lkey)); rc != 0 {
		return fmt.Errorf("verbs: ibv_post_srq_recv(%d receives): %w", len(idx), syscall.Errno(rc))
	}
	return nil
}

// Close destroys the SRQ; its QPs must be closed first.
func (s *SRQ) Close() error {
	if s == nil || s.s == nil {
		return nil
	}
	if err := s.kids.busy("SRQ"); err != nil {
		return err
	}
	if rc := C.b2b_destroy_srq(s.s); rc != 0 {
		return fmt.Errorf("verbs: ibv_destroy_srq: %w", syscall.Errno(rc))
	}
	s.s = nil
	s.parent.kids.n.Add(-1)
	return nil
}

// QPConfig describes an RC QP.
type QPConfig struct {
	SendCQ, RecvCQ *CQ
	SRQ            *SRQ // receives come from the SRQ (nil: a one-entry RQ)
	MaxSendWR      int
	MaxSendSGE     int
	MaxInline      int
}

// QPCaps is what the provider granted.
type QPCaps struct {
	MaxSendWR, MaxSendSGE, MaxInline int
}

// QP is a reliable-connected queue pair.
type QP struct {
	q      *C.struct_ibv_qp
	pd     *PD
	scq    *CQ
	rcq    *CQ
	srq    *SRQ
	num    uint32
	caps   QPCaps
	closed atomic.Bool
}

// NewRCQP creates an RC QP in the RESET state.
func (pd *PD) NewRCQP(cfg QPConfig) (*QP, error) {
	if pd.p == nil {
		return nil, errClosed("PD")
	}
	if cfg.SendCQ == nil || cfg.RecvCQ == nil || cfg.SendCQ.cq == nil || cfg.RecvCQ.cq == nil {
		return nil, fmt.Errorf("verbs: ibv_create_qp: send and receive CQs are required: %w", errs.ErrInvalidArgument)
	}
	var srq *C.struct_ibv_srq
	if cfg.SRQ != nil {
		srq = cfg.SRQ.s
	}
	var caps [3]C.uint32_t
	q, errno := C.b2b_create_rc_qp(pd.p, cfg.SendCQ.cq, cfg.RecvCQ.cq, srq,
		C.uint32_t(cfg.MaxSendWR), C.uint32_t(cfg.MaxSendSGE), C.uint32_t(cfg.MaxInline), &caps[0])
	if q == nil {
		return nil, fmt.Errorf("verbs: ibv_create_qp(RC, max_send_wr=%d, max_send_sge=%d, max_inline=%d, srq=%t): %w",
			cfg.MaxSendWR, cfg.MaxSendSGE, cfg.MaxInline, srq != nil, errno)
	}
	pd.kids.n.Add(1)
	cfg.SendCQ.kids.n.Add(1)
	if cfg.RecvCQ != cfg.SendCQ {
		cfg.RecvCQ.kids.n.Add(1)
	}
	if cfg.SRQ != nil {
		cfg.SRQ.kids.n.Add(1)
	}
	return &QP{q: q, pd: pd, scq: cfg.SendCQ, rcq: cfg.RecvCQ, srq: cfg.SRQ, num: uint32(C.b2b_qp_num(q)),
		caps: QPCaps{MaxSendWR: int(caps[0]), MaxSendSGE: int(caps[1]), MaxInline: int(caps[2])}}, nil
}

// Num is the QP number.
func (q *QP) Num() uint32 { return q.num }

// Caps is what the provider granted at creation.
func (q *QP) Caps() QPCaps { return q.caps }

// ToInit moves RESET → INIT.
func (q *QP) ToInit(port int, access Access) error {
	if rc := C.b2b_qp_to_init(q.q, C.uint8_t(port), C.int(access)); rc != 0 {
		return fmt.Errorf("verbs: QP %d RESET→INIT (port %d): %w", q.num, port, syscall.Errno(rc))
	}
	return nil
}

// RTRAttr is the remote side as INIT→RTR needs it.
type RTRAttr struct {
	Port        int
	RemoteQPN   uint32
	RemotePSN   uint32
	MTU         MTU
	Global      bool // RoCE: always (GRH with the remote GID)
	RemoteGID   GID
	GIDIndex    int // our source GID index
	RemoteLID   uint16
	MinRNRTimer int
}

// ToRTR moves INIT → RTR.
func (q *QP) ToRTR(a RTRAttr) error {
	var hi, lo uint64
	for k := 0; k < 8; k++ {
		hi = hi<<8 | uint64(a.RemoteGID[k])
		lo = lo<<8 | uint64(a.RemoteGID[8+k])
	}
	glob := C.int(0)
	if a.Global {
		glob = 1
	}
	if rc := C.b2b_qp_to_rtr(q.q, C.uint8_t(a.Port), C.uint32_t(a.RemoteQPN), C.uint32_t(a.RemotePSN),
		C.int(a.MTU), glob, C.uint64_t(hi), C.uint64_t(lo), C.uint8_t(a.GIDIndex), C.uint16_t(a.RemoteLID),
		C.uint8_t(a.MinRNRTimer)); rc != 0 {
		return fmt.Errorf("verbs: QP %d INIT→RTR (remote QPN %d, remote PSN %d, path MTU %s, local GID index %d, remote GID %s, remote LID %d, global %t): %w",
			q.num, a.RemoteQPN, a.RemotePSN, a.MTU, a.GIDIndex, a.RemoteGID, a.RemoteLID, a.Global, syscall.Errno(rc))
	}
	return nil
}

// RTSAttr is what RTR → RTS needs.
type RTSAttr struct {
	PSN        uint32
	Timeout    int // 4.096 µs * 2^Timeout per retry
	RetryCount int
	RNRRetry   int // 7 = infinite
}

// ToRTS moves RTR → RTS.
func (q *QP) ToRTS(a RTSAttr) error {
	if rc := C.b2b_qp_to_rts(q.q, C.uint32_t(a.PSN), C.uint8_t(a.Timeout), C.uint8_t(a.RetryCount), C.uint8_t(a.RNRRetry)); rc != 0 {
		return fmt.Errorf("verbs: QP %d RTR→RTS (PSN %d, timeout %d, retry %d, rnr_retry %d): %w",
			q.num, a.PSN, a.Timeout, a.RetryCount, a.RNRRetry, syscall.Errno(rc))
	}
	return nil
}

// ToError moves the QP to ERR, flushing outstanding WRs.
func (q *QP) ToError() error {
	if rc := C.b2b_qp_to_err(q.q); rc != 0 {
		return fmt.Errorf("verbs: QP %d →ERR: %w", q.num, syscall.Errno(rc))
	}
	return nil
}

// State is the QP's current ibv_qp_state (0 RESET .. 6 ERR).
func (q *QP) State() (int, error) {
	rc := int(C.b2b_qp_state(q.q))
	if rc < 0 {
		return 0, fmt.Errorf("verbs: ibv_query_qp(%d): %w", q.num, syscall.Errno(-rc))
	}
	return rc, nil
}

// PostSend posts one WR (SEND, SEND_WITH_IMM or WRITE_WITH_IMM) of at most
// one SGE; length 0 means no SGE.
func (q *QP) PostSend(wrID uint64, op WROpcode, imm uint32, addr uint64, n, lkey uint32, signaled bool) error {
	fl := C.int(0)
	if signaled {
		fl = C.IBV_SEND_SIGNALED
	}
	if rc := C.b2b_post_send1(q.q, C.uint64_t(wrID), C.int(op), C.uint32_t(imm), C.uint64_t(addr), C.uint32_t(n), C.uint32_t(lkey), fl); rc != 0 {
		return postErr(q.num, int(rc))
	}
	return nil
}

func postErr(qpn uint32, rc int) error {
	return fmt.Errorf("verbs: ibv_post_send on QP %d: %w (send queue full or QP not in RTS): %w", qpn, syscall.Errno(rc), errs.ErrAborted)
}

// Close destroys the QP.
func (q *QP) Close() error {
	if q == nil || q.q == nil {
		return nil
	}
	if rc := C.b2b_destroy_qp(q.q); rc != 0 {
		return fmt.Errorf("verbs: ibv_destroy_qp(%d): %w", q.num, syscall.Errno(rc))
	}
	q.q = nil
	q.closed.Store(true)
	q.pd.kids.n.Add(-1)
	q.scq.kids.n.Add(-1)
	if q.rcq != q.scq {
		q.rcq.kids.n.Add(-1)
	}
	if q.srq != nil {
		q.srq.kids.n.Add(-1)
	}
	return nil
}

// HostMem is C-allocated, page-aligned memory (never the Go heap), for
// control buffers and tests.
type HostMem struct {
	p unsafe.Pointer
	n int
}

// AllocHost allocates n zeroed bytes.
func AllocHost(n int) (*HostMem, error) {
	if n <= 0 {
		return nil, fmt.Errorf("verbs: alloc %d bytes: %w", n, errs.ErrInvalidArgument)
	}
	p := C.b2b_alloc(C.size_t(n))
	if p == nil {
		return nil, fmt.Errorf("verbs: alloc %d bytes: %w", n, syscall.ENOMEM)
	}
	return &HostMem{p: p, n: n}, nil
}

// Addr is the base address.
func (h *HostMem) Addr() uintptr { return uintptr(h.p) }

// Bytes views the memory.
func (h *HostMem) Bytes() []byte { return unsafe.Slice((*byte)(h.p), h.n) }

// Free releases it; safe twice.
func (h *HostMem) Free() {
	if h != nil && h.p != nil {
		C.b2b_free(h.p)
		h.p = nil
	}
}
