//go:build cgo && linux

package verbs

/*
#cgo noescape b2bv_drain_async
#cgo nocallback b2bv_drain_async
#include "b2bv.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"
)

// ListDevices names the devices libibverbs can open.
func ListDevices() ([]string, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	var l **C.struct_ibv_device
	var n C.int
	if rc := C.b2bv_get_device_list(&l, &n); rc != 0 {
		return nil, deviceListErr(rc)
	}
	defer C.b2bv_free_device_list(l)
	devs := unsafe.Slice(l, int(n))
	names := make([]string, 0, len(devs))
	for _, d := range devs {
		names = append(names, C.GoString(C.b2bv_device_name(d)))
	}
	return names, nil
}

func deviceListErr(rc C.int) error {
	hint := ""
	if errors.Is(syscall.Errno(-rc), syscall.ENOSYS) {
		hint = " (the kernel exposes no RDMA devices: load the NIC's driver, or add a Soft-RoCE link with `rdma link add rxe0 type rxe netdev IF`)"
	}
	return callErr(rc, 0, "ibv_get_device_list", hint, ErrUnavailable)
}

// asyncBatch is how many async events one DrainAsync call copies out.
const asyncBatch = 16

// Context is an open device (ibv_context).
type Context struct {
	c     *C.struct_ibv_context
	name  string
	attr  DeviceAttr
	kids  children
	async [asyncBatch]C.struct_b2bv_async
}

// Open opens the named device ("" = the first one).
func Open(name string) (*Context, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	var l **C.struct_ibv_device
	var n C.int
	if rc := C.b2bv_get_device_list(&l, &n); rc != 0 {
		return nil, deviceListErr(rc)
	}
	defer C.b2bv_free_device_list(l)
	devs := unsafe.Slice(l, int(n))
	if len(devs) == 0 {
		return nil, fmt.Errorf("verbs: no RDMA device found (is rdma-core's provider for the NIC installed, or an rxe link added?): %w", ErrUnavailable)
	}
	var dev *C.struct_ibv_device
	var seen []string
	for _, d := range devs {
		dn := C.GoString(C.b2bv_device_name(d))
		seen = append(seen, dn)
		if name == "" || dn == name {
			dev, name = d, dn
			break
		}
	}
	if dev == nil {
		return nil, fmt.Errorf("verbs: device %q not found (have %v): %w", name, seen, ErrUnavailable)
	}
	var c *C.struct_ibv_context
	if rc := C.b2bv_open_device(dev, &c); rc != 0 {
		return nil, callErr(rc, 0, fmt.Sprintf("ibv_open_device(%s)", name), "", ErrUnavailable)
	}
	ctx := &Context{c: c, name: name}
	var a C.struct_ibv_device_attr
	if rc := C.b2bv_query_device(c, &a); rc != 0 {
		C.b2bv_close_device(c)
		return nil, callErr(rc, 0, fmt.Sprintf("ibv_query_device(%s)", name), "", nil)
	}
	ctx.attr = DeviceAttr{
		FWVersion:      C.GoString(&a.fw_ver[0]),
		VendorID:       uint32(a.vendor_id),
		PartID:         uint32(a.vendor_part_id),
		MaxMRSize:      uint64(a.max_mr_size),
		MaxQP:          int(a.max_qp),
		MaxQPWR:        int(a.max_qp_wr),
		MaxSGE:         int(a.max_sge),
		MaxCQ:          int(a.max_cq),
		MaxCQE:         int(a.max_cqe),
		MaxMR:          int(a.max_mr),
		MaxSRQ:         int(a.max_srq),
		MaxSRQWR:       int(a.max_srq_wr),
		MaxSRQSGE:      int(a.max_srq_sge),
		PhysPorts:      int(a.phys_port_cnt),
		MaxQPRdAtm:     int(a.max_qp_rd_atom),
		MaxQPInitRdAtm: int(a.max_qp_init_rd_atom),
		MaxSGERd:       int(a.max_sge_rd),
	}
	if err := setNonblock(C.b2bv_async_fd(c), "async fd"); err != nil {
		C.b2bv_close_device(c)
		return nil, err
	}
	return ctx, nil
}

func setNonblock(fd C.int, what string) error {
	return callErr(C.b2bv_set_nonblock(fd), 0, fmt.Sprintf("set %s non-blocking", what), "", nil)
}

// ctx returns the open ibv_context, or nil when c is nil or closed.
func (c *Context) ctx() *C.struct_ibv_context {
	if c == nil {
		return nil
	}
	return c.c
}

// Name is the device name, e.g. "mlx5_0" or "rxe0".
func (c *Context) Name() string {
	if c == nil {
		return ""
	}
	return c.name
}

// Attr is the device's capabilities.
func (c *Context) Attr() DeviceAttr {
	if c == nil {
		return DeviceAttr{}
	}
	return c.attr
}

// QueryPort reads a port's attributes.
func (c *Context) QueryPort(port int) (PortAttr, error) {
	cc := c.ctx()
	if cc == nil {
		return PortAttr{}, errClosed("ibv_query_port: context")
	}
	var a C.struct_ibv_port_attr
	if rc := C.b2bv_query_port(cc, C.uint8_t(port), &a); rc != 0 {
		return PortAttr{}, callErr(rc, 0, fmt.Sprintf("ibv_query_port(%s, %d)", c.name, port), "", nil)
	}
	return PortAttr{
		State:       PortState(a.state),
		MaxMTU:      MTU(a.max_mtu),
		ActiveMTU:   MTU(a.active_mtu),
		GIDTableLen: int(a.gid_tbl_len),
		MaxMsgSize:  uint32(a.max_msg_sz),
		LID:         uint16(a.lid),
		LinkLayer:   LinkLayer(a.link_layer),
		ActiveSpeed: uint8(a.active_speed),
		ActiveWidth: uint8(a.active_width),
	}, nil
}

// QueryGID reads one GID table entry.
func (c *Context) QueryGID(port, index int) (GID, error) {
	var g GID
	cc := c.ctx()
	if cc == nil {
		return g, errClosed("ibv_query_gid: context")
	}
	var raw [16]C.uint8_t
	if rc := C.b2bv_query_gid(cc, C.uint8_t(port), C.int(index), &raw[0]); rc != 0 {
		return g, callErr(rc, 0, fmt.Sprintf("ibv_query_gid(%s, port %d, index %d)", c.name, port, index), "", nil)
	}
	for k := range raw {
		g[k] = byte(raw[k])
	}
	return g, nil
}

// AsyncFD is the non-blocking fd that becomes readable on async events
// (-1 once closed).
func (c *Context) AsyncFD() int {
	cc := c.ctx()
	if cc == nil {
		return -1
	}
	return int(C.b2bv_async_fd(cc))
}

// DrainAsync reads (and acknowledges) pending async events into out and
// returns how many it stored (0 once closed).
func (c *Context) DrainAsync(out []AsyncEvent) int {
	cc := c.ctx()
	if cc == nil || len(out) == 0 {
		return 0
	}
	m := min(len(out), len(c.async))
	var n C.int
	if C.b2bv_drain_async(cc, &c.async[0], C.int(m), &n) != 0 {
		return 0
	}
	for k := 0; k < int(n); k++ {
		a := &c.async[k]
		out[k] = AsyncEvent{Type: int(a._type), QPNum: uint32(a.qp_num), Port: int(a.port)}
	}
	return int(n)
}

// Close closes the device; every child must be closed first. Closing a
// closed or nil context does nothing.
func (c *Context) Close() error {
	cc := c.ctx()
	if cc == nil {
		return nil
	}
	if err := c.kids.busy("context " + c.name); err != nil {
		return err
	}
	if rc := C.b2bv_close_device(cc); rc != 0 {
		return callErr(rc, 0, fmt.Sprintf("ibv_close_device(%s)", c.name), "", nil)
	}
	c.c = nil
	return nil
}
