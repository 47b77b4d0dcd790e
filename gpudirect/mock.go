package gpudirect

import (
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"sync"
	"unsafe"

	"github.com/b2bd/b2bd/internal/errs"
)

// MockDevice configures one device simulated by Mock.
type MockDevice struct {
	Name                   string
	PCIBusID               string
	TotalMem               uint64 // 1 GiB when 0; MemAlloc beyond it fails with CUDA_ERROR_OUT_OF_MEMORY
	ComputeMajor           int
	ComputeMinor           int
	DmabufSupported        bool
	GPUDirectRDMASupported bool
}

// Mock is a hand-written, in-memory Interface for tests of code that uses
// the CUDA layer. Device memory is simulated by Go byte slices at fake device
// addresses, so copies really move bytes: between device allocations, IPC
// mappings, HostAlloc buffers and HostRegister'd ranges (which must be real,
// live host memory). Copies run synchronously when queued, so streams and
// events are always complete. Unlike CUDA, a handle may be opened in the
// process that exported it (the mock mapping aliases the allocation).
//
// FailNext injects errors; Calls counts calls; Leaks lists what is still held.
type Mock struct {
	mu       sync.Mutex
	devices  []MockDevice
	version  int
	caps     Capabilities
	closed   bool
	fail     map[string][]error
	calls    map[string]int
	next     uintptr
	used     []uint64               // bytes allocated per device
	ranges   map[uintptr]*mockRange // by base: device allocations, IPC mappings, host memory
	handles  map[IPCHandle]uintptr  // exported handle -> allocation base
	streams  map[*Stream]struct{}
	events   map[*Event]struct{}
	nextFD   int
	openFDs  map[int]struct{}
	batches  int
	copies   int
	hostPins map[uintptr][]byte // keeps HostAlloc slices alive
}

type mockKind int

const (
	mockDevice mockKind = iota + 1
	mockIPC
	mockHostAlloc
	mockHostReg
)

func (k mockKind) String() string {
	return [...]string{"", "device allocation", "IPC mapping", "host allocation", "host registration"}[k]
}

type mockRange struct {
	kind       mockKind
	dev        int
	base       uintptr
	data       []byte
	syncMemops bool
	owner      uintptr // IPC mappings: the allocation's base
}

// NewMock returns a Mock with the given devices (one default device when
// none is given). It reports driver version 13000 and both optional
// features (cuMemcpyBatchAsync_v2, cuMemGetHandleForAddressRange).
func NewMock(devices ...MockDevice) *Mock {
	if len(devices) == 0 {
		devices = []MockDevice{{Name: "Mock GPU", DmabufSupported: true, GPUDirectRDMASupported: true}}
	}
	m := &Mock{
		devices:  make([]MockDevice, len(devices)),
		version:  13000,
		caps:     Capabilities{MemcpyBatch: true, MemcpyBatchSymbol: "cuMemcpyBatchAsync_v2", DmabufExport: true},
		fail:     map[string][]error{},
		calls:    map[string]int{},
		next:     0x7e0000000000,
		used:     make([]uint64, len(devices)),
		ranges:   map[uintptr]*mockRange{},
		handles:  map[IPCHandle]uintptr{},
		streams:  map[*Stream]struct{}{},
		events:   map[*Event]struct{}{},
		nextFD:   1 << 20,
		openFDs:  map[int]struct{}{},
		hostPins: map[uintptr][]byte{},
	}
	for i, d := range devices {
		if d.Name == "" {
			d.Name = fmt.Sprintf("Mock GPU %d", i)
		}
		if d.PCIBusID == "" {
			d.PCIBusID = fmt.Sprintf("0000:%02x:00.0", 0x10+i)
		}
		if d.TotalMem == 0 {
			d.TotalMem = 1 << 30
		}
		if d.ComputeMajor == 0 {
			d.ComputeMajor, d.ComputeMinor = 9, 0
		}
		m.devices[i] = d
	}
	return m
}

// SetCapabilities overrides what Capabilities reports (and what the mock
// then allows: ExportDmabuf needs DmabufExport).
func (m *Mock) SetCapabilities(c Capabilities) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.caps = c
}

// FailNext makes the next call of method (an Interface method name, e.g.
// "MemAlloc") return err instead of doing anything. Calls queue up.
func (m *Mock) FailNext(method string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fail[method] = append(m.fail[method], err)
}

// FailNextResult is FailNext with a CUDA error, wrapped as the real
// implementation wraps it.
func (m *Mock) FailNextResult(method string, r Result) {
	m.FailNext(method, fmt.Errorf("gpudirect: mock %s: %w", method, &Error{Result: r}))
}

// Calls returns how often method was called.
func (m *Mock) Calls(method string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[method]
}

// BatchStats returns the number of MemcpyBatchAsync calls and of copies
// they carried.
func (m *Mock) BatchStats() (batches, copies int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.batches, m.copies
}

// Leaks lists everything still held: allocations, mappings, registrations,
// streams, events and dma-buf descriptors not closed. Sorted.
func (m *Mock) Leaks() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, r := range m.ranges {
		out = append(out, fmt.Sprintf("%s %#x (%d bytes) on device %d", r.kind, r.base, len(r.data), r.dev))
	}
	for s := range m.streams {
		out = append(out, fmt.Sprintf("stream %d on device %d", s.id, s.dev))
	}
	for e := range m.events {
		out = append(out, fmt.Sprintf("event %d on device %d", e.id, e.dev))
	}
	for fd := range m.openFDs {
		out = append(out, fmt.Sprintf("dma-buf fd %d", fd))
	}
	sort.Strings(out)
	return out
}

// DeviceBytes returns the simulated memory [ptr, ptr+n) of a device
// allocation or IPC mapping; writes to it are seen by later copies.
func (m *Mock) DeviceBytes(ptr uintptr, n uint64) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, off, err := m.find(uint64(ptr), n, true)
	if err != nil {
		return nil, err
	}
	return r.data[off : off+n : off+n], nil
}

// enter counts the call and returns an injected or closed error.
func (m *Mock) enter(method string) error {
	m.calls[method]++
	if q := m.fail[method]; len(q) > 0 {
		m.fail[method] = q[1:]
		return q[0]
	}
	if m.closed {
		return ErrClosed
	}
	return nil
}

func (m *Mock) checkDev(dev int) error {
	if dev < 0 || dev >= len(m.devices) {
		return fmt.Errorf("%w: gpudirect: CUDA device %d does not exist (this host has %d)", errs.ErrInvalidArgument, dev, len(m.devices))
	}
	return nil
}

func mockErr(dev int, call string, r Result) error {
	return fmt.Errorf("gpudirect: %s on device %d: %w", call, dev, &Error{Result: r, Name: r.String()})
}

// find locates [addr, addr+n) inside one range; deviceOnly skips host ranges.
func (m *Mock) find(addr, n uint64, deviceOnly bool) (*mockRange, uint64, error) {
	for _, r := range m.ranges {
		if deviceOnly && r.kind != mockDevice && r.kind != mockIPC {
			continue
		}
		b := uint64(r.base)
		if addr >= b && addr-b <= uint64(len(r.data)) && n <= uint64(len(r.data))-(addr-b) {
			return r, addr - b, nil
		}
	}
	return nil, 0, fmt.Errorf("%w: gpudirect: mock: [%#x, +%d) is not inside any allocation, mapping or registered host range", errs.ErrInvalidArgument, addr, n)
}

func (m *Mock) bytesAt(addr, n uint64) ([]byte, error) {
	r, off, err := m.find(addr, n, false)
	if err != nil {
		return nil, err
	}
	return r.data[off : off+n], nil
}

func (m *Mock) newAddr(size uint64) uintptr {
	const align = 2 << 20
	p := m.next
	m.next += uintptr((size + align - 1) &^ (align - 1))
	if size == 0 {
		m.next += align
	}
	return p
}

func (m *Mock) DriverVersion() int { return m.version }

func (m *Mock) DeviceCount() int { return len(m.devices) }

func (m *Mock) Capabilities() Capabilities {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.caps
}

func (m *Mock) DeviceInfo(dev int) (DeviceInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("DeviceInfo"); err != nil {
		return DeviceInfo{}, err
	}
	if err := m.checkDev(dev); err != nil {
		return DeviceInfo{}, err
	}
	d := m.devices[dev]
	return DeviceInfo{
		Ordinal: dev, Name: d.Name, PCIBusID: normalizePCIBusID(d.PCIBusID), TotalMem: d.TotalMem,
		ComputeMajor: d.ComputeMajor, ComputeMinor: d.ComputeMinor,
		DmabufSupported: d.DmabufSupported, GPUDirectRDMASupported: d.GPUDirectRDMASupported,
	}, nil
}

func (m *Mock) MemAlloc(dev int, size uint64) (uintptr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("MemAlloc"); err != nil {
		return 0, err
	}
	if err := m.checkDev(dev); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, fmt.Errorf("%w: gpudirect: cuMemAlloc_v2 on device %d: size is 0", errs.ErrInvalidArgument, dev)
	}
	if m.used[dev]+size > m.devices[dev].TotalMem || m.used[dev]+size < size {
		return 0, mockErr(dev, fmt.Sprintf("cuMemAlloc_v2(size=%d)", size), ErrorOutOfMemory)
	}
	p := m.newAddr(size)
	m.used[dev] += size
	m.ranges[p] = &mockRange{kind: mockDevice, dev: dev, base: p, data: make([]byte, size)}
	return p, nil
}

func (m *Mock) MemFree(dev int, ptr uintptr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("MemFree"); err != nil {
		return err
	}
	if err := m.checkDev(dev); err != nil {
		return err
	}
	r, ok := m.ranges[ptr]
	if !ok || r.kind != mockDevice || r.dev != dev {
		return fmt.Errorf("%w: gpudirect: cuMemFree_v2(%#x) on device %d: not an allocation made by MemAlloc", errs.ErrInvalidArgument, ptr, dev)
	}
	delete(m.ranges, ptr)
	m.used[dev] -= uint64(len(r.data))
	for h, base := range m.handles {
		if base == ptr {
			delete(m.handles, h)
		}
	}
	return nil
}

func (m *Mock) PointerInfo(dev int, ptr uintptr) (PointerInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("PointerInfo"); err != nil {
		return PointerInfo{}, err
	}
	if err := m.checkDev(dev); err != nil {
		return PointerInfo{}, err
	}
	r, _, err := m.find(uint64(ptr), 0, false)
	if err != nil {
		return PointerInfo{}, fmt.Errorf("address %#x is not memory CUDA knows: %w", ptr,
			mockErr(dev, fmt.Sprintf("cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, %#x)", ptr), ErrorInvalidValue))
	}
	info := PointerInfo{Device: r.dev, RangeStart: r.base, RangeSize: uint64(len(r.data)), SyncMemops: r.syncMemops}
	switch r.kind {
	case mockDevice, mockIPC:
		info.MemoryType = MemoryTypeDevice
		info.GPUDirectRDMACapable = m.devices[r.dev].GPUDirectRDMASupported
	default:
		info.MemoryType = MemoryTypeHost
	}
	return info, nil
}

func (m *Mock) SetSyncMemops(dev int, ptr uintptr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("SetSyncMemops"); err != nil {
		return err
	}
	if err := m.checkDev(dev); err != nil {
		return err
	}
	r, _, err := m.find(uint64(ptr), 0, true)
	if err != nil {
		return mockErr(dev, fmt.Sprintf("cuPointerSetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS=1, %#x)", ptr), ErrorInvalidValue)
	}
	r.syncMemops = true
	return nil
}

func (m *Mock) ExportDmabuf(dev int, ptr uintptr, size uint64, flags DmabufFlags) (*Dmabuf, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("ExportDmabuf"); err != nil {
		return nil, err
	}
	if err := m.checkDev(dev); err != nil {
		return nil, err
	}
	if !m.caps.DmabufExport {
		return nil, fmt.Errorf("%w: gpudirect: the CUDA driver (version %d) has no cuMemGetHandleForAddressRange", errs.ErrUnimplemented, m.version)
	}
	if !m.devices[dev].DmabufSupported {
		return nil, fmt.Errorf("%w: gpudirect: device %d reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED=0", errs.ErrUnimplemented, dev)
	}
	base, length, off, ok := alignRange(ptr, size, uint64(os.Getpagesize()))
	if !ok {
		return nil, fmt.Errorf("%w: gpudirect: dma-buf export of [%#x, +%d) on device %d: empty or overflowing range", errs.ErrInvalidArgument, ptr, size, dev)
	}
	if _, _, err := m.find(uint64(ptr), size, true); err != nil {
		return nil, mockErr(dev, fmt.Sprintf("cuMemGetHandleForAddressRange(ptr=%#x, size=%d)", base, length), ErrorInvalidValue)
	}
	fd := m.nextFD
	m.nextFD++
	m.openFDs[fd] = struct{}{}
	return &Dmabuf{FD: fd, Base: base, Len: length, Offset: off, closeFD: m.closeFD}, nil
}

func (m *Mock) closeFD(fd int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	if _, ok := m.openFDs[fd]; !ok {
		return fmt.Errorf("gpudirect: mock: close dma-buf fd %d: not open", fd)
	}
	delete(m.openFDs, fd)
	return nil
}

func (m *Mock) IPCGetMemHandle(dev int, ptr uintptr) (IPCHandle, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("IPCGetMemHandle"); err != nil {
		return IPCHandle{}, err
	}
	if err := m.checkDev(dev); err != nil {
		return IPCHandle{}, err
	}
	r, ok := m.ranges[ptr]
	if !ok || r.kind != mockDevice {
		return IPCHandle{}, mockErr(dev, fmt.Sprintf("cuIpcGetMemHandle(%#x)", ptr), ErrorInvalidValue)
	}
	var h IPCHandle
	copy(h[:], "b2bd-mock-ipc")
	binary.LittleEndian.PutUint64(h[16:], uint64(ptr))
	binary.LittleEndian.PutUint64(h[24:], uint64(len(r.data)))
	m.handles[h] = ptr
	return h, nil
}

func (m *Mock) IPCOpenMemHandle(dev int, h IPCHandle) (uintptr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("IPCOpenMemHandle"); err != nil {
		return 0, err
	}
	if err := m.checkDev(dev); err != nil {
		return 0, err
	}
	if h == (IPCHandle{}) {
		return 0, fmt.Errorf("%w: gpudirect: cuIpcOpenMemHandle_v2 on device %d: IPC handle is all zeros", errs.ErrInvalidArgument, dev)
	}
	base, ok := m.handles[h]
	if !ok {
		return 0, mockErr(dev, "cuIpcOpenMemHandle_v2(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)", ErrorInvalidValue)
	}
	src := m.ranges[base]
	p := m.newAddr(uint64(len(src.data)))
	m.ranges[p] = &mockRange{kind: mockIPC, dev: dev, base: p, data: src.data, owner: base}
	return p, nil
}

func (m *Mock) IPCCloseMemHandle(dev int, ptr uintptr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("IPCCloseMemHandle"); err != nil {
		return err
	}
	r, ok := m.ranges[ptr]
	if !ok || r.kind != mockIPC || r.dev != dev {
		return fmt.Errorf("%w: gpudirect: cuIpcCloseMemHandle(%#x) on device %d: not a mapping made by IPCOpenMemHandle", errs.ErrInvalidArgument, ptr, dev)
	}
	delete(m.ranges, ptr)
	return nil
}

func (m *Mock) HostAlloc(dev int, size int) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("HostAlloc"); err != nil {
		return nil, err
	}
	if err := m.checkDev(dev); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("%w: gpudirect: cuMemHostAlloc on device %d: size %d", errs.ErrInvalidArgument, dev, size)
	}
	b := make([]byte, size)
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	m.ranges[p] = &mockRange{kind: mockHostAlloc, dev: dev, base: p, data: b}
	m.hostPins[p] = b
	return b, nil
}

func (m *Mock) HostFree(dev int, b []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("HostFree"); err != nil {
		return err
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	r, ok := m.ranges[p]
	if len(b) == 0 || !ok || r.kind != mockHostAlloc || r.dev != dev {
		return fmt.Errorf("%w: gpudirect: cuMemFreeHost(%#x) on device %d: not memory from HostAlloc", errs.ErrInvalidArgument, p, dev)
	}
	delete(m.ranges, p)
	delete(m.hostPins, p)
	return nil
}

// hostView is the host memory [addr, addr+n) as a slice. The caller of
// HostRegister vouches that it is live memory outside the Go heap.
func hostView(addr uintptr, n uint64) []byte {
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

func (m *Mock) HostRegister(dev int, addr uintptr, size uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("HostRegister"); err != nil {
		return err
	}
	if err := m.checkDev(dev); err != nil {
		return err
	}
	if size == 0 || addr == 0 {
		return fmt.Errorf("%w: gpudirect: cuMemHostRegister_v2(%#x, %d) on device %d: empty range", errs.ErrInvalidArgument, addr, size, dev)
	}
	if _, ok := m.ranges[addr]; ok {
		return fmt.Errorf("%w: gpudirect: cuMemHostRegister_v2(%#x) on device %d: already registered", errs.ErrAlreadyExists, addr, dev)
	}
	m.ranges[addr] = &mockRange{kind: mockHostReg, dev: dev, base: addr, data: hostView(addr, size)}
	return nil
}

func (m *Mock) HostUnregister(dev int, addr uintptr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("HostUnregister"); err != nil {
		return err
	}
	r, ok := m.ranges[addr]
	if !ok || r.kind != mockHostReg || r.dev != dev {
		return fmt.Errorf("%w: gpudirect: cuMemHostUnregister(%#x) on device %d: not registered with HostRegister", errs.ErrNotFound, addr, dev)
	}
	delete(m.ranges, addr)
	return nil
}

func (m *Mock) stream(s *Stream) error {
	switch {
	case s == nil:
		return fmt.Errorf("%w: gpudirect: nil stream", errs.ErrInvalidArgument)
	case s.owner != any(m):
		return fmt.Errorf("%w: gpudirect: stream was created by another Interface", errs.ErrInvalidArgument)
	case s.h == 0:
		return fmt.Errorf("%w: gpudirect: stream was destroyed", errs.ErrFailedPrecondition)
	}
	return nil
}

func (m *Mock) event(e *Event) error {
	switch {
	case e == nil:
		return fmt.Errorf("%w: gpudirect: nil event", errs.ErrInvalidArgument)
	case e.owner != any(m):
		return fmt.Errorf("%w: gpudirect: event was created by another Interface", errs.ErrInvalidArgument)
	case e.h == 0:
		return fmt.Errorf("%w: gpudirect: event was destroyed", errs.ErrFailedPrecondition)
	}
	return nil
}

func (m *Mock) StreamCreate(dev int) (*Stream, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("StreamCreate"); err != nil {
		return nil, err
	}
	if err := m.checkDev(dev); err != nil {
		return nil, err
	}
	s := &Stream{dev: dev, owner: m, id: handleIDs.Add(1)}
	s.h = uintptr(s.id)
	m.streams[s] = struct{}{}
	return s, nil
}

func (m *Mock) StreamSynchronize(s *Stream) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("StreamSynchronize"); err != nil {
		return err
	}
	return m.stream(s)
}

func (m *Mock) StreamDestroy(s *Stream) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("StreamDestroy"); err != nil {
		return err
	}
	if s != nil && s.owner == any(m) && s.h == 0 {
		return nil
	}
	if err := m.stream(s); err != nil {
		return err
	}
	s.h = 0
	delete(m.streams, s)
	return nil
}

func (m *Mock) EventCreate(dev int) (*Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("EventCreate"); err != nil {
		return nil, err
	}
	if err := m.checkDev(dev); err != nil {
		return nil, err
	}
	e := &Event{dev: dev, owner: m, id: handleIDs.Add(1)}
	e.h = uintptr(e.id)
	m.events[e] = struct{}{}
	return e, nil
}

func (m *Mock) EventRecord(e *Event, s *Stream) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("EventRecord"); err != nil {
		return err
	}
	if err := m.event(e); err != nil {
		return err
	}
	if err := m.stream(s); err != nil {
		return err
	}
	if e.dev != s.dev {
		return fmt.Errorf("%w: gpudirect: cuEventRecord: event is on device %d, stream on device %d", errs.ErrInvalidArgument, e.dev, s.dev)
	}
	return nil
}

func (m *Mock) EventQuery(e *Event) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("EventQuery"); err != nil {
		return false, err
	}
	if err := m.event(e); err != nil {
		return false, err
	}
	return true, nil
}

func (m *Mock) EventSynchronize(e *Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("EventSynchronize"); err != nil {
		return err
	}
	return m.event(e)
}

func (m *Mock) EventDestroy(e *Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("EventDestroy"); err != nil {
		return err
	}
	if e != nil && e.owner == any(m) && e.h == 0 {
		return nil
	}
	if err := m.event(e); err != nil {
		return err
	}
	e.h = 0
	delete(m.events, e)
	return nil
}

func (m *Mock) copy(dst, src, size uint64) error {
	d, err := m.bytesAt(dst, size)
	if err != nil {
		return fmt.Errorf("destination: %w", err)
	}
	s, err := m.bytesAt(src, size)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	copy(d, s)
	return nil
}

func (m *Mock) MemcpyHtoDAsync(s *Stream, dst, src uintptr, size uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("MemcpyHtoDAsync"); err != nil {
		return err
	}
	if err := m.stream(s); err != nil {
		return err
	}
	if size == 0 {
		return nil
	}
	if _, _, err := m.find(uint64(dst), size, true); err != nil {
		return mockErr(s.dev, fmt.Sprintf("cuMemcpyHtoDAsync_v2(dst=%#x, src=%#x, size=%d)", dst, src, size), ErrorInvalidValue)
	}
	if err := m.copy(uint64(dst), uint64(src), size); err != nil {
		return fmt.Errorf("gpudirect: cuMemcpyHtoDAsync_v2 on device %d: %w", s.dev, err)
	}
	return nil
}

func (m *Mock) MemcpyDtoHAsync(s *Stream, dst, src uintptr, size uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("MemcpyDtoHAsync"); err != nil {
		return err
	}
	if err := m.stream(s); err != nil {
		return err
	}
	if size == 0 {
		return nil
	}
	if _, _, err := m.find(uint64(src), size, true); err != nil {
		return mockErr(s.dev, fmt.Sprintf("cuMemcpyDtoHAsync_v2(dst=%#x, src=%#x, size=%d)", dst, src, size), ErrorInvalidValue)
	}
	if err := m.copy(uint64(dst), uint64(src), size); err != nil {
		return fmt.Errorf("gpudirect: cuMemcpyDtoHAsync_v2 on device %d: %w", s.dev, err)
	}
	return nil
}

func (m *Mock) MemcpyBatchAsync(s *Stream, dsts, srcs, sizes []uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("MemcpyBatchAsync"); err != nil {
		return err
	}
	if err := m.stream(s); err != nil {
		return err
	}
	if err := checkBatch(dsts, srcs, sizes); err != nil {
		return err
	}
	m.batches++
	m.copies += len(sizes)
	for i := range sizes {
		if err := m.copy(dsts[i], srcs[i], sizes[i]); err != nil {
			return fmt.Errorf("gpudirect: cuMemcpyBatchAsync_v2(count=%d) on device %d: copy %d: %w", len(sizes), s.dev, i, err)
		}
	}
	return nil
}

// Close releases everything (as the real implementation does); safe twice.
func (m *Mock) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls["Close"]++
	if m.closed {
		return nil
	}
	m.closed = true
	for s := range m.streams {
		s.h = 0
	}
	for e := range m.events {
		e.h = 0
	}
	clear(m.streams)
	clear(m.events)
	clear(m.ranges)
	clear(m.hostPins)
	clear(m.handles)
	clear(m.openFDs)
	clear(m.used)
	return nil
}

var _ Interface = (*Mock)(nil)
