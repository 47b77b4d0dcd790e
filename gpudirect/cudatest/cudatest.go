// Package cudatest is an in-memory implementation of gpudirect.Interface
// for tests of code that uses the CUDA layer. It lives in its own package so
// that the daemon does not link it.
package cudatest

import (
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"sync"
	"unsafe"

	"github.com/b2bd/b2bd/gpudirect"
)

// Device configures one device simulated by Driver.
type Device struct {
	Name                   string
	PCIBusID               string
	TotalMem               uint64 // 1 GiB when 0; MemAlloc beyond it fails with CUDA_ERROR_OUT_OF_MEMORY
	ComputeMajor           int
	ComputeMinor           int
	DmabufSupported        bool
	GPUDirectRDMASupported bool
}

// Driver is a hand-written, in-memory gpudirect.Interface for tests of code that uses
// the CUDA layer. Device memory is simulated by Go byte slices at fake device
// addresses, so copies really move bytes: between device allocations, IPC
// mappings, HostAlloc buffers and HostRegister'd ranges (which must be real,
// live host memory). Copies run synchronously when queued, so streams and
// events are always complete. Unlike CUDA, a handle may be opened in the
// process that exported it (the mock mapping aliases the allocation).
//
// FailNext injects errors; Calls counts calls; Leaks lists what is still held.
type Driver struct {
	mu       sync.Mutex
	devices  []Device
	version  int
	caps     gpudirect.Capabilities
	closed   bool
	fail     map[string][]error
	calls    map[string]int
	next     uintptr
	used     []uint64                        // bytes allocated per device
	ranges   map[uintptr]*mockRange          // by base: device allocations, IPC mappings, host memory
	handles  map[gpudirect.IPCHandle]uintptr // exported handle -> allocation base
	streams  map[*gpudirect.Stream]struct{}
	events   map[*gpudirect.Event]struct{}
	nextFD   int
	openFDs  map[int]struct{}
	batches  int
	copies   int
	kinds    CopyKinds
	hostPins map[uintptr][]byte // keeps HostAlloc slices alive
	// pageable: host memory CUDA does not know may be copied (as the real
	// driver does, staging it itself); off, such a copy fails.
	pageable bool
	// ownRefused: IPCOpenMemHandle refuses the handles of this mock's own
	// allocations, as CUDA refuses a process's own handles, except those
	// marked foreign (an application's allocation, made in another
	// process). Off (the default), every exported handle opens, so that
	// one mock can stand for the driver of two daemons.
	ownRefused bool
	foreign    map[gpudirect.IPCHandle]bool
	notes      map[int][]string // DeviceNotes
}

// RefuseOwnHandles makes IPCOpenMemHandle refuse the handles of this
// mock's allocations not marked with Foreign, as CUDA refuses a process's
// own IPC handles.
func (m *Driver) RefuseOwnHandles(on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ownRefused = on
}

// Foreign marks h as another process's handle: IPCOpenMemHandle opens it
// whatever RefuseOwnHandles says.
func (m *Driver) Foreign(h gpudirect.IPCHandle) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.foreign == nil {
		m.foreign = map[gpudirect.IPCHandle]bool{}
	}
	m.foreign[h] = true
}

const (
	// firstAddr is where simulated device addresses start: high in the
	// address space, where no Go heap or mmap'd host memory is, so a device
	// address never aliases host memory in find.
	firstAddr = 0x7e0000000000
	// firstFD is the first simulated dma-buf descriptor, far above any real
	// one, so that closing it by mistake with close(2) fails harmlessly.
	firstFD = 1 << 20
)

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

// New returns a Driver with the given devices (one default device when
// none is given). It reports driver version 13000 and both optional
// features (cuMemcpyBatchAsync_v2, cuMemGetHandleForAddressRange).
func New(devices ...Device) *Driver {
	if len(devices) == 0 {
		devices = []Device{{Name: "Mock GPU", DmabufSupported: true, GPUDirectRDMASupported: true}}
	}
	m := &Driver{
		devices:  make([]Device, len(devices)),
		version:  13000,
		caps:     gpudirect.Capabilities{MemcpyBatch: true, MemcpyBatchSymbol: "cuMemcpyBatchAsync_v2", DmabufExport: true, PeerAccess: true},
		fail:     map[string][]error{},
		calls:    map[string]int{},
		next:     firstAddr,
		used:     make([]uint64, len(devices)),
		ranges:   map[uintptr]*mockRange{},
		handles:  map[gpudirect.IPCHandle]uintptr{},
		streams:  map[*gpudirect.Stream]struct{}{},
		events:   map[*gpudirect.Event]struct{}{},
		nextFD:   firstFD,
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

// SetCapabilities overrides what gpudirect.Capabilities reports (and what the mock
// then allows: ExportDmabuf needs DmabufExport).
func (m *Driver) SetCapabilities(c gpudirect.Capabilities) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.caps = c
}

// SetPageableHost lets copies use host memory that is neither HostAlloc'd
// nor HostRegister'd (pageable memory, which the real driver accepts and
// stages itself); the caller vouches that such addresses are live memory
// outside the Go heap. Copies() counts them in PageableHostSide.
func (m *Driver) SetPageableHost(on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pageable = on
}

// HostRegistered reports whether [addr, addr+n) lies in one HostRegister'd
// range.
func (m *Driver) HostRegistered(addr uintptr, n uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, _, err := m.find(uint64(addr), n, false)
	return err == nil && r.kind == mockHostReg
}

// FailNext makes the next call of method (an gpudirect.Interface method name, e.g.
// "MemAlloc") return err instead of doing anything. Calls queue up.
func (m *Driver) FailNext(method string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fail[method] = append(m.fail[method], err)
}

// FailNextResult is FailNext with a CUDA error, wrapped as the real
// implementation wraps it.
func (m *Driver) FailNextResult(method string, r gpudirect.Result) {
	m.FailNext(method, fmt.Errorf("gpudirect: mock %s: %w", method, &gpudirect.Error{Result: r}))
}

// Calls returns how often method was called.
func (m *Driver) Calls(method string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[method]
}

// BatchStats returns the number of MemcpyBatchAsync calls and of copies
// they carried.
func (m *Driver) BatchStats() (batches, copies int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.batches, m.copies
}

// CopyKinds counts batched copies by where their ends lie.
type CopyKinds struct {
	// SameDevice: device memory to device memory of one physical device
	// (an IPC mapping counts as the device that allocated it): what the
	// real driver runs on SMs.
	SameDevice int
	// CrossDevice: device memory to another device's memory.
	CrossDevice                            int
	HostToDevice, DeviceToHost, HostToHost int
	// PinnedHostSide and PageableHostSide split the host-to-device and
	// device-to-host copies by their host end: HostAlloc'd or
	// HostRegister'd (what the copy engines reach directly), or pageable
	// (SetPageableHost; the real driver stages it on the compute engine).
	PinnedHostSide, PageableHostSide int
}

// Copies returns the batched copies so far by kind.
func (m *Driver) Copies() CopyKinds {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.kinds
}

// physDev is the device that holds r's memory (m.mu held).
func (m *Driver) physDev(r *mockRange) int {
	if r.kind == mockIPC {
		if o := m.ranges[r.owner]; o != nil {
			return o.dev
		}
	}
	return r.dev
}

// count classifies one copy (m.mu held).
func (m *Driver) count(dst, src, size uint64) {
	rd, _, derr := m.find(dst, size, true)
	rs, _, serr := m.find(src, size, true)
	switch {
	case derr == nil && serr == nil && m.physDev(rd) == m.physDev(rs):
		m.kinds.SameDevice++
	case derr == nil && serr == nil:
		m.kinds.CrossDevice++
	case derr == nil:
		m.kinds.HostToDevice++
		m.countHostSide(src, size)
	case serr == nil:
		m.kinds.DeviceToHost++
		m.countHostSide(dst, size)
	default:
		m.kinds.HostToHost++
	}
}

// countHostSide counts a host end by whether CUDA knows it (m.mu held).
func (m *Driver) countHostSide(addr, size uint64) {
	if _, _, err := m.find(addr, size, false); err == nil {
		m.kinds.PinnedHostSide++
	} else {
		m.kinds.PageableHostSide++
	}
}

// Leaks lists everything still held: allocations, mappings, registrations,
// streams, events and dma-buf descriptors not closed. Sorted.
func (m *Driver) Leaks() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, r := range m.ranges {
		out = append(out, fmt.Sprintf("%s %#x (%d bytes) on device %d", r.kind, r.base, len(r.data), r.dev))
	}
	for s := range m.streams {
		out = append(out, fmt.Sprintf("stream %d on device %d", s.ID(), s.Device()))
	}
	for e := range m.events {
		out = append(out, fmt.Sprintf("event %d on device %d", e.ID(), e.Device()))
	}
	for fd := range m.openFDs {
		out = append(out, fmt.Sprintf("dma-buf fd %d", fd))
	}
	sort.Strings(out)
	return out
}

// DeviceBytes returns the simulated memory [ptr, ptr+n) of a device
// allocation or IPC mapping; writes to it are seen by later copies.
func (m *Driver) DeviceBytes(ptr uintptr, n uint64) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, off, err := m.find(uint64(ptr), n, true)
	if err != nil {
		return nil, err
	}
	return r.data[off : off+n : off+n], nil
}

// enter counts the call and returns an injected or closed error.
func (m *Driver) enter(method string) error {
	m.calls[method]++
	if q := m.fail[method]; len(q) > 0 {
		m.fail[method] = q[1:]
		return q[0]
	}
	if m.closed {
		return gpudirect.ErrClosed
	}
	return nil
}

func (m *Driver) checkDev(dev int) error {
	if dev < 0 || dev >= len(m.devices) {
		return fmt.Errorf("%w: gpudirect: CUDA device %d does not exist (this host has %d)", gpudirect.ErrInvalidValue, dev, len(m.devices))
	}
	return nil
}

func mockErr(dev int, call string, r gpudirect.Result) error {
	return fmt.Errorf("gpudirect: %s on device %d: %w", call, dev, &gpudirect.Error{Result: r, Name: r.String()})
}

// find locates [addr, addr+n) inside one range; deviceOnly skips host ranges.
func (m *Driver) find(addr, n uint64, deviceOnly bool) (*mockRange, uint64, error) {
	for _, r := range m.ranges {
		if deviceOnly && r.kind != mockDevice && r.kind != mockIPC {
			continue
		}
		b := uint64(r.base)
		if addr >= b && addr-b <= uint64(len(r.data)) && n <= uint64(len(r.data))-(addr-b) {
			return r, addr - b, nil
		}
	}
	return nil, 0, fmt.Errorf("%w: gpudirect: mock: [%#x, +%d) is not inside any allocation, mapping or registered host range", gpudirect.ErrInvalidValue, addr, n)
}

func (m *Driver) bytesAt(addr, n uint64) ([]byte, error) {
	r, off, err := m.find(addr, n, false)
	// Pageable host memory: anything outside the simulated device
	// addresses [firstAddr, m.next).
	if err != nil && m.pageable && addr != 0 && addr+n > addr && (addr+n <= firstAddr || addr >= uint64(m.next)) {
		return hostView(uintptr(addr), n), nil
	}
	if err != nil {
		return nil, err
	}
	return r.data[off : off+n], nil
}

func (m *Driver) newAddr(size uint64) uintptr {
	const align = 2 << 20
	p := m.next
	m.next += uintptr((size + align - 1) &^ (align - 1))
	if size == 0 {
		m.next += align
	}
	return p
}

func (m *Driver) DriverVersion() int { return m.version }

func (m *Driver) DeviceCount() int { return len(m.devices) }

// DeviceNotes returns what SetDeviceNotes gave for dev.
func (m *Driver) DeviceNotes(dev int) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.notes[dev]
}

// SetDeviceNotes makes DeviceNotes(dev) return notes.
func (m *Driver) SetDeviceNotes(dev int, notes ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.notes == nil {
		m.notes = map[int][]string{}
	}
	m.notes[dev] = notes
}

func (m *Driver) Capabilities() gpudirect.Capabilities {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.caps
}

func (m *Driver) DeviceInfo(dev int) (gpudirect.DeviceInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("gpudirect.DeviceInfo"); err != nil {
		return gpudirect.DeviceInfo{}, err
	}
	if err := m.checkDev(dev); err != nil {
		return gpudirect.DeviceInfo{}, err
	}
	d := m.devices[dev]
	return gpudirect.DeviceInfo{
		Ordinal: dev, Name: d.Name, PCIBusID: gpudirect.NormalizePCIBusID(d.PCIBusID), TotalMem: d.TotalMem,
		ComputeMajor: d.ComputeMajor, ComputeMinor: d.ComputeMinor,
		DmabufSupported: d.DmabufSupported, GPUDirectRDMASupported: d.GPUDirectRDMASupported,
	}, nil
}

func (m *Driver) MemAlloc(dev int, size uint64) (uintptr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("MemAlloc"); err != nil {
		return 0, err
	}
	if err := m.checkDev(dev); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, fmt.Errorf("%w: gpudirect: cuMemAlloc_v2 on device %d: size is 0", gpudirect.ErrInvalidValue, dev)
	}
	if m.used[dev]+size > m.devices[dev].TotalMem || m.used[dev]+size < size {
		return 0, mockErr(dev, fmt.Sprintf("cuMemAlloc_v2(size=%d)", size), gpudirect.ErrorOutOfMemory)
	}
	p := m.newAddr(size)
	m.used[dev] += size
	m.ranges[p] = &mockRange{kind: mockDevice, dev: dev, base: p, data: make([]byte, size)}
	return p, nil
}

func (m *Driver) MemFree(dev int, ptr uintptr) error {
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
		return fmt.Errorf("%w: gpudirect: cuMemFree_v2(%#x) on device %d: not an allocation made by MemAlloc", gpudirect.ErrInvalidValue, ptr, dev)
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

func (m *Driver) PointerInfo(dev int, ptr uintptr) (gpudirect.PointerInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("gpudirect.PointerInfo"); err != nil {
		return gpudirect.PointerInfo{}, err
	}
	if err := m.checkDev(dev); err != nil {
		return gpudirect.PointerInfo{}, err
	}
	r, _, err := m.find(uint64(ptr), 0, false)
	if err != nil {
		return gpudirect.PointerInfo{}, fmt.Errorf("address %#x is not memory CUDA knows: %w", ptr,
			mockErr(dev, fmt.Sprintf("cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, %#x)", ptr), gpudirect.ErrorInvalidValue))
	}
	info := gpudirect.PointerInfo{Device: r.dev, RangeStart: r.base, RangeSize: uint64(len(r.data)), SyncMemops: r.syncMemops}
	switch r.kind {
	case mockDevice, mockIPC:
		info.MemoryType = gpudirect.MemoryTypeDevice
		info.GPUDirectRDMACapable = m.devices[r.dev].GPUDirectRDMASupported
	default:
		info.MemoryType = gpudirect.MemoryTypeHost
	}
	return info, nil
}

func (m *Driver) SetSyncMemops(dev int, ptr uintptr) error {
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
		return mockErr(dev, fmt.Sprintf("cuPointerSetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS=1, %#x)", ptr), gpudirect.ErrorInvalidValue)
	}
	r.syncMemops = true
	return nil
}

func (m *Driver) ExportDmabuf(dev int, ptr uintptr, size uint64, flags gpudirect.DmabufFlags) (*gpudirect.Dmabuf, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("ExportDmabuf"); err != nil {
		return nil, err
	}
	if err := m.checkDev(dev); err != nil {
		return nil, err
	}
	if !m.caps.DmabufExport {
		return nil, fmt.Errorf("%w: gpudirect: the CUDA driver (version %d) has no cuMemGetHandleForAddressRange", gpudirect.ErrNotSupported, m.version)
	}
	if !m.devices[dev].DmabufSupported {
		return nil, fmt.Errorf("%w: gpudirect: device %d reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED=0", gpudirect.ErrNotSupported, dev)
	}
	base, length, off, ok := gpudirect.AlignRange(ptr, size, uint64(os.Getpagesize()))
	if !ok {
		return nil, fmt.Errorf("%w: gpudirect: dma-buf export of [%#x, +%d) on device %d: empty or overflowing range", gpudirect.ErrInvalidValue, ptr, size, dev)
	}
	if _, _, err := m.find(uint64(ptr), size, true); err != nil {
		return nil, mockErr(dev, fmt.Sprintf("cuMemGetHandleForAddressRange(ptr=%#x, size=%d)", base, length), gpudirect.ErrorInvalidValue)
	}
	fd := m.nextFD
	m.nextFD++
	m.openFDs[fd] = struct{}{}
	return gpudirect.NewDmabuf(fd, base, length, off, m.closeFD), nil
}

func (m *Driver) closeFD(fd int) error {
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

func (m *Driver) IPCGetMemHandle(dev int, ptr uintptr) (gpudirect.IPCHandle, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("IPCGetMemHandle"); err != nil {
		return gpudirect.IPCHandle{}, err
	}
	if err := m.checkDev(dev); err != nil {
		return gpudirect.IPCHandle{}, err
	}
	r, ok := m.ranges[ptr]
	if !ok || r.kind != mockDevice {
		return gpudirect.IPCHandle{}, mockErr(dev, fmt.Sprintf("cuIpcGetMemHandle(%#x)", ptr), gpudirect.ErrorInvalidValue)
	}
	var h gpudirect.IPCHandle
	copy(h[:], "b2bd-mock-ipc")
	binary.LittleEndian.PutUint64(h[16:], uint64(ptr))
	binary.LittleEndian.PutUint64(h[24:], uint64(len(r.data)))
	m.handles[h] = ptr
	return h, nil
}

func (m *Driver) IPCOpenMemHandle(dev int, h gpudirect.IPCHandle) (uintptr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("IPCOpenMemHandle"); err != nil {
		return 0, err
	}
	if err := m.checkDev(dev); err != nil {
		return 0, err
	}
	if h == (gpudirect.IPCHandle{}) {
		return 0, fmt.Errorf("%w: gpudirect: cuIpcOpenMemHandle_v2 on device %d: IPC handle is all zeros", gpudirect.ErrInvalidValue, dev)
	}
	base, ok := m.handles[h]
	if !ok {
		return 0, mockErr(dev, "cuIpcOpenMemHandle_v2(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)", gpudirect.ErrorInvalidValue)
	}
	if m.ownRefused && !m.foreign[h] {
		return 0, mockErr(dev, "cuIpcOpenMemHandle_v2(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)", gpudirect.ErrorInvalidContext)
	}
	src := m.ranges[base]
	p := m.newAddr(uint64(len(src.data)))
	m.ranges[p] = &mockRange{kind: mockIPC, dev: dev, base: p, data: src.data, owner: base}
	return p, nil
}

// EnablePeerAccess succeeds between any two devices unless
// SetCapabilities turned PeerAccess off.
func (m *Driver) EnablePeerAccess(dev, peer int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("EnablePeerAccess"); err != nil {
		return err
	}
	if err := m.checkDev(dev); err != nil {
		return err
	}
	if err := m.checkDev(peer); err != nil {
		return err
	}
	if dev != peer && !m.caps.PeerAccess {
		return fmt.Errorf("%w: gpudirect: mock device %d cannot reach device %d's memory directly", gpudirect.ErrNotSupported, dev, peer)
	}
	return nil
}

func (m *Driver) IPCCloseMemHandle(dev int, ptr uintptr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("IPCCloseMemHandle"); err != nil {
		return err
	}
	r, ok := m.ranges[ptr]
	if !ok || r.kind != mockIPC || r.dev != dev {
		return fmt.Errorf("%w: gpudirect: cuIpcCloseMemHandle(%#x) on device %d: not a mapping made by IPCOpenMemHandle", gpudirect.ErrInvalidValue, ptr, dev)
	}
	delete(m.ranges, ptr)
	return nil
}

func (m *Driver) HostAlloc(dev int, size int) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("HostAlloc"); err != nil {
		return nil, err
	}
	if err := m.checkDev(dev); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("%w: gpudirect: cuMemHostAlloc on device %d: size %d", gpudirect.ErrInvalidValue, dev, size)
	}
	b := make([]byte, size)
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	m.ranges[p] = &mockRange{kind: mockHostAlloc, dev: dev, base: p, data: b}
	m.hostPins[p] = b
	return b, nil
}

func (m *Driver) HostFree(dev int, b []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("HostFree"); err != nil {
		return err
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	r, ok := m.ranges[p]
	if len(b) == 0 || !ok || r.kind != mockHostAlloc || r.dev != dev {
		return fmt.Errorf("%w: gpudirect: cuMemFreeHost(%#x) on device %d: not memory from HostAlloc", gpudirect.ErrInvalidValue, p, dev)
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

func (m *Driver) HostRegister(dev int, addr uintptr, size uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("HostRegister"); err != nil {
		return err
	}
	if err := m.checkDev(dev); err != nil {
		return err
	}
	if size == 0 || addr == 0 {
		return fmt.Errorf("%w: gpudirect: cuMemHostRegister_v2(%#x, %d) on device %d: empty range", gpudirect.ErrInvalidValue, addr, size, dev)
	}
	if _, ok := m.ranges[addr]; ok {
		return fmt.Errorf("%w: gpudirect: cuMemHostRegister_v2(%#x) on device %d: already registered", gpudirect.ErrAlreadyExists, addr, dev)
	}
	m.ranges[addr] = &mockRange{kind: mockHostReg, dev: dev, base: addr, data: hostView(addr, size)}
	return nil
}

func (m *Driver) HostUnregister(dev int, addr uintptr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("HostUnregister"); err != nil {
		return err
	}
	r, ok := m.ranges[addr]
	if !ok || r.kind != mockHostReg || r.dev != dev {
		return fmt.Errorf("%w: gpudirect: cuMemHostUnregister(%#x) on device %d: not registered with HostRegister", gpudirect.ErrNotFound, addr, dev)
	}
	delete(m.ranges, addr)
	return nil
}

// liveStream and liveEvent: made here and not destroyed (m.mu held).
// Close releases everything (as the real implementation does); safe twice.
func (m *Driver) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls["Close"]++
	if m.closed {
		return nil
	}
	m.closed = true
	clear(m.streams)
	clear(m.events)
	clear(m.ranges)
	clear(m.hostPins)
	clear(m.handles)
	clear(m.openFDs)
	clear(m.used)
	return nil
}

var _ gpudirect.Interface = (*Driver)(nil)
