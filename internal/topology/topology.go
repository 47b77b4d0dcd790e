// Package topology ranks RDMA devices (rails) by their distance to a piece
// of memory, from sysfs alone: for GPU memory, the PCIe path from the GPU
// to each NIC (same PCIe switch, then same root complex, then same NUMA
// node, then the rest); for host memory, the NUMA node the memory lives on
// against each NIC's. Nothing here needs cgo or a device: tests build fake
// sysfs trees (a DGX-like layout) in a temporary directory.
package topology

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/b2bd/b2bd/internal/errs"
)

// Tier is how close a NIC is to the memory; lower is closer.
type Tier int

const (
	// SameSwitch: the GPU and the NIC share a PCIe bridge below the root
	// complex (a switch, or the same root port): peer-to-peer traffic
	// never crosses the CPU.
	SameSwitch Tier = iota
	// SameRootComplex: the same PCI host bridge (pciDDDD:BB).
	SameRootComplex
	// SameNUMA: the same NUMA node (host memory: the memory's node).
	SameNUMA
	// Unknown: the NUMA node of the NIC or of the memory is not known.
	Unknown
	// Other: across the socket interconnect.
	Other
)

func (t Tier) String() string {
	switch t {
	case SameSwitch:
		return "same PCIe switch"
	case SameRootComplex:
		return "same root complex"
	case SameNUMA:
		return "same NUMA node"
	case Unknown:
		return "NUMA unknown"
	case Other:
		return "other socket"
	}
	return fmt.Sprintf("tier(%d)", int(t))
}

// Device is a PCI function's place in the tree.
type Device struct {
	Name  string   // what the caller calls it: "mlx5_0", "GPU 3"
	BusID string   // its own PCI address ("0000:3b:00.0"), the chain's last element
	Root  string   // host bridge, "pci0000:3a"
	Chain []string // PCI addresses from the root port down to the device itself
	NUMA  int      // -1 when unknown
}

// Sysfs reads a sysfs tree under Root ("" = "/").
type Sysfs struct{ Root string }

func (s Sysfs) path(p ...string) string {
	root := s.Root
	if root == "" {
		root = "/"
	}
	return filepath.Join(append([]string{root}, p...)...)
}

// PCIDevice finds the PCI function busID (any case, 4- or 8-digit domain).
func (s Sysfs) PCIDevice(name, busID string) (Device, error) {
	id, err := ParseBusID(busID)
	if err != nil {
		return Device{}, err
	}
	return s.device(name, s.path("sys/bus/pci/devices", id))
}

// RDMADevice finds the PCI function behind an RDMA device: its own
// "device" link, else (Soft-RoCE, which has none) its parent netdev's.
func (s Sysfs) RDMADevice(name string) (Device, error) {
	if strings.ContainsAny(name, "/\x00") || name == "" || name == "." || name == ".." {
		return Device{}, fmt.Errorf("topology: RDMA device name %q: %w", name, errs.ErrInvalidArgument)
	}
	link := s.path("sys/class/infiniband", name, "device")
	if _, err := os.Stat(link); err == nil {
		return s.device(name, link)
	}
	parent, err := os.ReadFile(s.path("sys/class/infiniband", name, "parent"))
	if err != nil {
		return Device{}, fmt.Errorf("topology: %s has neither a device link nor a parent netdev: %w", name, err)
	}
	nd := strings.TrimSpace(string(parent))
	if nd == "" || strings.ContainsAny(nd, "/\x00") {
		return Device{}, fmt.Errorf("topology: %s: parent netdev %q: %w", name, nd, errs.ErrInvalidArgument)
	}
	return s.device(name, s.path("sys/class/net", nd, "device"))
}

// device resolves link (a sysfs device path or a symlink to one) and reads
// its NUMA node from the nearest PCI function.
func (s Sysfs) device(name, link string) (Device, error) {
	real, err := filepath.EvalSymlinks(link)
	if err != nil {
		return Device{}, fmt.Errorf("topology: %s: resolve %s: %w", name, link, err)
	}
	root := s.path()
	rel := strings.TrimPrefix(real, strings.TrimSuffix(root, "/"))
	d, err := ParseDevicePath(rel)
	if err != nil {
		return Device{}, fmt.Errorf("topology: %s: %w", name, err)
	}
	d.Name = name
	d.NUMA = -1
	if b, err := os.ReadFile(s.path("sys/bus/pci/devices", d.BusID, "numa_node")); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 0 {
			d.NUMA = n
		}
	}
	return d, nil
}

// Nodes lists the NUMA nodes sysfs knows; nil when it lists none.
func (s Sysfs) Nodes() []int {
	ents, _ := os.ReadDir(s.path("sys/devices/system/node"))
	var out []int
	for _, e := range ents {
		if n, ok := strings.CutPrefix(e.Name(), "node"); ok {
			if v, err := strconv.Atoi(n); err == nil {
				out = append(out, v)
			}
		}
	}
	sort.Ints(out)
	return out
}

// ParseBusID checks a PCI address ("dddd:bb:dd.f"; CUDA's 8-digit domain
// and upper case are accepted) and returns it in sysfs form: lower case,
// 4-digit domain.
func ParseBusID(s string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("topology: PCI bus id %q: %s (want dddd:bb:dd.f): %w", s, why, errs.ErrInvalidArgument)
	}
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return bad("not three colon-separated fields")
	}
	dom, bus := parts[0], parts[1]
	devfn := strings.Split(parts[2], ".")
	if len(devfn) != 2 {
		return bad("no .function")
	}
	dev, fn := devfn[0], devfn[1]
	hex := func(f string, n int, max uint64) (uint64, bool) {
		if len(f) != n {
			return 0, false
		}
		v, err := strconv.ParseUint(f, 16, 32)
		return v, err == nil && v <= max
	}
	var d uint64
	var ok bool
	switch len(dom) {
	case 4:
		d, ok = hex(dom, 4, 0xffff)
	case 8:
		d, ok = hex(dom, 8, 0xffff)
	}
	if !ok {
		return bad("domain is not 4 (or 8) hex digits up to ffff")
	}
	b, ok := hex(bus, 2, 0xff)
	if !ok {
		return bad("bus is not 2 hex digits")
	}
	dv, ok := hex(dev, 2, 0x1f)
	if !ok {
		return bad("device is not 2 hex digits up to 1f")
	}
	f, ok := hex(fn, 1, 7)
	if !ok {
		return bad("function is not 0..7")
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", d, b, dv, f), nil
}

// ParseDevicePath parses a resolved sysfs device path such as
// "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:08.0/0000:3d:00.0"
// (trailing non-PCI components such as "virtio2" or "net/eth0" are ignored)
// into its host bridge and the chain of PCI functions below it.
func ParseDevicePath(p string) (Device, error) {
	var d Device
	comps := strings.Split(strings.Trim(p, "/"), "/")
	if len(comps) < 3 || comps[0] != "sys" || comps[1] != "devices" {
		return d, fmt.Errorf("topology: device path %q is not under /sys/devices: %w", p, errs.ErrInvalidArgument)
	}
	rest := comps[2:]
	root := rest[0]
	dom, ok := strings.CutPrefix(root, "pci")
	if !ok {
		return d, fmt.Errorf("topology: device path %q is not on a PCI host bridge (starts with %q): %w", p, root, errs.ErrInvalidArgument)
	}
	if _, err := ParseBusID(dom + ":00.0"); err != nil {
		return d, fmt.Errorf("topology: device path %q: host bridge %q is not pciDDDD:BB: %w", p, root, errs.ErrInvalidArgument)
	}
	d.Root = strings.ToLower(root)
	for _, c := range rest[1:] {
		id, err := ParseBusID(c)
		if err != nil {
			break // virtio0, net, ...: below the last PCI function
		}
		d.Chain = append(d.Chain, id)
	}
	if len(d.Chain) == 0 {
		return d, fmt.Errorf("topology: device path %q has no PCI function below %s: %w", p, root, errs.ErrInvalidArgument)
	}
	d.BusID = d.Chain[len(d.Chain)-1]
	return d, nil
}

// Between is the tier of NIC n for memory on GPU g.
func Between(g, n Device) Tier {
	if len(g.Chain) == 0 || len(n.Chain) == 0 { // not found in sysfs
		return numaTier(g.NUMA, n.NUMA)
	}
	// Shared PCI bridges: the chains' common prefix, not counting the
	// endpoints themselves.
	a, b := g.Chain[:len(g.Chain)-1], n.Chain[:len(n.Chain)-1]
	common := 0
	for common < len(a) && common < len(b) && a[common] == b[common] {
		common++
	}
	switch {
	case g.Root == n.Root && common > 0:
		return SameSwitch
	case g.Root == n.Root:
		return SameRootComplex
	}
	return numaTier(g.NUMA, n.NUMA)
}

func numaTier(mem, nic int) Tier {
	switch {
	case mem < 0 || nic < 0:
		return Unknown
	case mem == nic:
		return SameNUMA
	}
	return Other
}

// Choice is one NIC's place in a ranking.
type Choice struct {
	NIC  string
	Tier Tier
}

// Location is where a region's memory lives: on a GPU (GPU set), or in
// host memory on NUMA node Node (-1: unknown).
type Location struct {
	GPU  *Device
	Node int
}

func (l Location) String() string {
	if l.GPU != nil {
		return fmt.Sprintf("GPU %s (%s, NUMA %d)", l.GPU.Name, l.GPU.BusID, l.GPU.NUMA)
	}
	if l.Node < 0 {
		return "host memory (NUMA unknown)"
	}
	return fmt.Sprintf("host memory (NUMA %d)", l.Node)
}

// Rank orders nics by tier for memory at loc, keeping their given order
// within a tier (stable), so rail order breaks ties.
func Rank(loc Location, nics []Device) []Choice {
	out := make([]Choice, len(nics))
	for i, n := range nics {
		t := numaTier(loc.Node, n.NUMA)
		if loc.GPU != nil {
			t = Between(*loc.GPU, n)
		}
		out[i] = Choice{NIC: n.Name, Tier: t}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Tier < out[j].Tier })
	return out
}

// Best is the leading choices of a ranking that share its best tier.
func Best(r []Choice) []Choice {
	n := 0
	for n < len(r) && r[n].Tier == r[0].Tier {
		n++
	}
	return r[:n]
}
