package topology

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// fakeSysfs builds a sysfs tree under a temporary directory: PCI functions
// under /sys/devices with their numa_node, the /sys/bus/pci/devices links,
// RDMA devices with a device link (mlx5) or a parent netdev (rxe).
type fakeSysfs struct {
	t    *testing.T
	root string
}

func newFake(t *testing.T) *fakeSysfs {
	return &fakeSysfs{t: t, root: t.TempDir()}
}

func (f *fakeSysfs) must(err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
}

// pci adds the function at the end of path ("pci0000:00/0000:00:01.0/...")
// with its NUMA node, and every bridge above it.
func (f *fakeSysfs) pci(path string, numa int) string {
	comps := strings.Split(path, "/")
	for i := 1; i < len(comps); i++ {
		dir := filepath.Join(f.root, "sys/devices", filepath.Join(comps[:i+1]...))
		f.must(os.MkdirAll(dir, 0o755))
		if _, err := os.Stat(filepath.Join(dir, "numa_node")); err != nil {
			f.must(os.WriteFile(filepath.Join(dir, "numa_node"), []byte(strconv.Itoa(numa)+"\n"), 0o644))
		}
		link := filepath.Join(f.root, "sys/bus/pci/devices", comps[i])
		f.must(os.MkdirAll(filepath.Dir(link), 0o755))
		if _, err := os.Lstat(link); err != nil {
			f.must(os.Symlink(filepath.Join("../../../devices", filepath.Join(comps[:i+1]...)), link))
		}
	}
	return filepath.Join(f.root, "sys/devices", path)
}

func (f *fakeSysfs) nic(name, path string, numa int) {
	dev := f.pci(path, numa)
	dir := filepath.Join(f.root, "sys/class/infiniband", name)
	f.must(os.MkdirAll(dir, 0o755))
	rel, err := filepath.Rel(dir, dev)
	f.must(err)
	f.must(os.Symlink(rel, filepath.Join(dir, "device")))
}

// rxe adds a Soft-RoCE device over netdev nd, whose device is a virtio
// function below the PCI function at path.
func (f *fakeSysfs) rxe(name, nd, path string, numa int) {
	virtio := filepath.Join(f.pci(path, numa), "virtio"+nd[len(nd)-1:])
	f.must(os.MkdirAll(filepath.Join(virtio, "net", nd), 0o755))
	dir := filepath.Join(f.root, "sys/class/infiniband", name)
	f.must(os.MkdirAll(dir, 0o755))
	f.must(os.WriteFile(filepath.Join(dir, "parent"), []byte(nd+"\n"), 0o644))
	ndir := filepath.Join(f.root, "sys/class/net", nd)
	f.must(os.MkdirAll(ndir, 0o755))
	rel, err := filepath.Rel(ndir, virtio)
	f.must(err)
	f.must(os.Symlink(rel, filepath.Join(ndir, "device")))
}

// dgx models two sockets the way DGX-class servers wire them: on socket 0,
// GPU0 and two NICs under one PCIe switch, GPU1 and one NIC under a second
// switch of the same root complex, a NIC on a second root complex of the
// same node; on socket 1, GPU4 and a NIC under a switch.
func dgx(t *testing.T) (*fakeSysfs, Sysfs) {
	f := newFake(t)
	f.pci("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", 0) // GPU0
	f.nic("mlx5_0", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:04:00.0", 0)
	f.nic("mlx5_1", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:05:00.0", 0)
	f.pci("pci0000:00/0000:00:02.0/0000:10:00.0/0000:11:00.0/0000:12:00.0", 0) // GPU1
	f.nic("mlx5_2", "pci0000:00/0000:00:02.0/0000:10:00.0/0000:11:08.0/0000:13:00.0", 0)
	f.nic("mlx5_3", "pci0000:20/0000:20:01.0/0000:21:00.0", 0)
	f.pci("pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0", 1) // GPU4
	f.nic("mlx5_4", "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:08.0/0000:84:00.0", 1)
	for _, n := range []string{"node0", "node1"} {
		f.must(os.MkdirAll(filepath.Join(f.root, "sys/devices/system/node", n), 0o755))
	}
	return f, Sysfs{Root: f.root}
}

func nics(t *testing.T, s Sysfs, names ...string) []Device {
	t.Helper()
	var out []Device
	for _, n := range names {
		d, err := s.RDMADevice(n)
		if err != nil {
			t.Fatalf("RDMADevice(%s): %v", n, err)
		}
		out = append(out, d)
	}
	return out
}

func TestRankDGX(t *testing.T) {
	_, s := dgx(t)
	all := nics(t, s, "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4")
	gpu := func(bus string) *Device {
		d, err := s.PCIDevice("GPU "+bus, bus)
		if err != nil {
			t.Fatal(err)
		}
		return &d
	}
	cases := []struct {
		name string
		loc  Location
		want []Choice
		best []string
	}{
		{"GPU0 under the switch of mlx5_0 and mlx5_1", Location{GPU: gpu("0000:03:00.0"), Node: -1},
			[]Choice{{"mlx5_0", SameSwitch}, {"mlx5_1", SameSwitch}, {"mlx5_2", SameRootComplex}, {"mlx5_3", SameNUMA}, {"mlx5_4", Other}},
			[]string{"mlx5_0", "mlx5_1"}},
		{"GPU1 under the switch of mlx5_2; CUDA's 8-digit upper-case bus id", Location{GPU: gpu("00000000:12:00.0"), Node: -1},
			[]Choice{{"mlx5_2", SameSwitch}, {"mlx5_0", SameRootComplex}, {"mlx5_1", SameRootComplex}, {"mlx5_3", SameNUMA}, {"mlx5_4", Other}},
			[]string{"mlx5_2"}},
		{"GPU4 across the socket from the rest", Location{GPU: gpu("0000:83:00.0"), Node: -1},
			[]Choice{{"mlx5_4", SameSwitch}, {"mlx5_0", Other}, {"mlx5_1", Other}, {"mlx5_2", Other}, {"mlx5_3", Other}},
			[]string{"mlx5_4"}},
		{"host memory on node 1", Location{Node: 1},
			[]Choice{{"mlx5_4", SameNUMA}, {"mlx5_0", Other}, {"mlx5_1", Other}, {"mlx5_2", Other}, {"mlx5_3", Other}},
			[]string{"mlx5_4"}},
		{"host memory on node 0", Location{Node: 0},
			[]Choice{{"mlx5_0", SameNUMA}, {"mlx5_1", SameNUMA}, {"mlx5_2", SameNUMA}, {"mlx5_3", SameNUMA}, {"mlx5_4", Other}},
			[]string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}},
		{"host memory, node unknown", Location{Node: -1},
			[]Choice{{"mlx5_0", Unknown}, {"mlx5_1", Unknown}, {"mlx5_2", Unknown}, {"mlx5_3", Unknown}, {"mlx5_4", Unknown}},
			[]string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Rank(c.loc, all)
			if !slices.Equal(got, c.want) {
				t.Fatalf("Rank(%s) = %v, want %v", c.loc, got, c.want)
			}
			var best []string
			for _, b := range Best(got) {
				best = append(best, b.NIC)
			}
			if !slices.Equal(best, c.best) {
				t.Fatalf("Best = %v, want %v", best, c.best)
			}
		})
	}
}

func TestRDMADevice(t *testing.T) {
	f, s := dgx(t)
	f.rxe("rxe0", "eth0", "pci0000:00/0000:00:03.0", -1)
	f.rxe("rxe1", "eth1", "pci0000:00/0000:00:04.0", -1)
	cases := []struct {
		name string
		want Device
		err  error
	}{
		{"mlx5_0", Device{Name: "mlx5_0", BusID: "0000:04:00.0", Root: "pci0000:00",
			Chain: []string{"0000:00:01.0", "0000:01:00.0", "0000:02:08.0", "0000:04:00.0"}, NUMA: 0}, nil},
		{"mlx5_4", Device{Name: "mlx5_4", BusID: "0000:84:00.0", Root: "pci0000:80",
			Chain: []string{"0000:80:01.0", "0000:81:00.0", "0000:82:08.0", "0000:84:00.0"}, NUMA: 1}, nil},
		{"rxe1", Device{Name: "rxe1", BusID: "0000:00:04.0", Root: "pci0000:00", Chain: []string{"0000:00:04.0"}, NUMA: -1}, nil},
		{"mlx5_9", Device{}, os.ErrNotExist},
		{"../x", Device{}, errs.ErrInvalidArgument},
	}
	for _, c := range cases {
		d, err := s.RDMADevice(c.name)
		if c.err != nil {
			if !errors.Is(err, c.err) {
				t.Errorf("RDMADevice(%s) error %v, want %v", c.name, err, c.err)
			}
			continue
		}
		if err != nil || d.Name != c.want.Name || d.BusID != c.want.BusID || d.Root != c.want.Root || d.NUMA != c.want.NUMA || !slices.Equal(d.Chain, c.want.Chain) {
			t.Errorf("RDMADevice(%s) = %+v, %v; want %+v", c.name, d, err, c.want)
		}
	}
	// Two Soft-RoCE devices on virtio functions of one host bridge, as in
	// the test VMs: no shared bridge, same root complex, NUMA unknown.
	r := nics(t, s, "rxe0", "rxe1")
	if got := Rank(Location{Node: -1}, r); !slices.Equal(got, []Choice{{"rxe0", Unknown}, {"rxe1", Unknown}}) {
		t.Errorf("rxe ranking for host memory: %v", got)
	}
	if got := Between(r[0], r[1]); got != SameRootComplex {
		t.Errorf("Between(rxe0, rxe1) = %v, want %v", got, SameRootComplex)
	}
	if n := s.Nodes(); !slices.Equal(n, []int{0, 1}) {
		t.Errorf("Nodes = %v", n)
	}
}

func TestParseBusID(t *testing.T) {
	cases := []struct{ in, want string }{
		{"0000:3b:00.0", "0000:3b:00.0"},
		{"0000:3B:00.0", "0000:3b:00.0"},
		{"00000000:3B:1F.7", "0000:3b:1f.7"},
		{"0001:00:00.1", "0001:00:00.1"},
		{"0000:3b:00", ""},
		{"0000:3b:20.0", ""},
		{"0000:3b:00.8", ""},
		{"000:3b:00.0", ""},
		{"00010000:3b:00.0", ""},
		{"0000:3b:00.0.0", ""},
		{"0000:+b:00.0", ""},
		{"", ""},
	}
	for _, c := range cases {
		got, err := ParseBusID(c.in)
		if c.want == "" {
			if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), "dddd:bb:dd.f") {
				t.Errorf("ParseBusID(%q) = %q, %v; want InvalidArgument naming the form", c.in, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseBusID(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

func TestParseDevicePath(t *testing.T) {
	cases := []struct {
		in    string
		root  string
		chain []string
	}{
		{"/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0", "pci0000:3a", []string{"0000:3a:00.0", "0000:3b:00.0"}},
		{"/sys/devices/pci0000:00/0000:00:03.0/virtio0/net/eth0", "pci0000:00", []string{"0000:00:03.0"}},
		{"/sys/devices/pci0000:00/0000:00:03.0/virtio0/0000:01:00.0", "pci0000:00", []string{"0000:00:03.0"}},
		{"/sys/devices/virtual/net/lo", "", nil},
		{"/sys/devices/pci0000:00", "", nil},
		{"/sys/devices/pcixyz/0000:00:01.0", "", nil},
		{"/proc/pci0000:00/0000:00:01.0", "", nil},
	}
	for _, c := range cases {
		d, err := ParseDevicePath(c.in)
		if c.root == "" {
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Errorf("ParseDevicePath(%q) = %+v, %v; want InvalidArgument", c.in, d, err)
			}
			continue
		}
		if err != nil || d.Root != c.root || !slices.Equal(d.Chain, c.chain) || d.BusID != c.chain[len(c.chain)-1] {
			t.Errorf("ParseDevicePath(%q) = %+v, %v", c.in, d, err)
		}
	}
}

func TestMemoryNode(t *testing.T) {
	b := make([]byte, 1<<16)
	b[0] = 1 // faulted in
	n, err := MemoryNode(uintptrOf(b))
	if err != nil {
		t.Skipf("move_pages unavailable here: %v", err)
	}
	nodes := Sysfs{}.Nodes()
	if len(nodes) > 0 && !slices.Contains(nodes, n) {
		t.Fatalf("MemoryNode = %d, not one of sysfs's nodes %v", n, nodes)
	}
}

func FuzzParseDevicePath(f *testing.F) {
	for _, s := range []string{
		"/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0",
		"/sys/devices/pci0000:00/0000:00:03.0/virtio0/net/eth0",
		"/sys/devices/pci00000000:00/0000:00:03.0",
		"/sys/devices/pci0000:00/00000000:3B:00.0",
		"", "/", "/sys/devices/", "0000:3b:00.0", "00000000:3B:1F.7",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if id, err := ParseBusID(p); err == nil {
			again, err := ParseBusID(id)
			if err != nil || again != id || len(id) != 12 {
				t.Fatalf("ParseBusID(%q) = %q, which parses as %q, %v", p, id, again, err)
			}
		} else if !errors.Is(err, errs.ErrInvalidArgument) {
			t.Fatalf("ParseBusID(%q): error without its class: %v", p, err)
		}
		d, err := ParseDevicePath(p)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("ParseDevicePath(%q): error without its class: %v", p, err)
			}
			return
		}
		if len(d.Chain) == 0 || d.BusID != d.Chain[len(d.Chain)-1] || !strings.HasPrefix(d.Root, "pci") {
			t.Fatalf("ParseDevicePath(%q) = %+v", p, d)
		}
		for _, c := range d.Chain {
			if id, err := ParseBusID(c); err != nil || id != c {
				t.Fatalf("ParseDevicePath(%q): chain element %q is not canonical", p, c)
			}
		}
		// Every device ranks against itself as sharing its own bridges.
		if len(d.Chain) > 1 && Between(d, d) != SameSwitch {
			t.Fatalf("Between(d, d) = %v for %+v", Between(d, d), d)
		}
	})
}
