package rails

import (
	"context"

	"github.com/b2bd/b2bd/internal/transport"
	"os"
	"path/filepath"
	"testing"

	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/topology"
)

// pciTree makes sysfs entries for PCI functions (each path from its host
// bridge) and RDMA devices pointing at some of them.
func pciTree(t *testing.T, fns map[string]string, nics map[string]string) string {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for id, path := range fns {
		dir := filepath.Join(root, "sys/devices", path)
		must(os.MkdirAll(dir, 0o755))
		must(os.WriteFile(filepath.Join(dir, "numa_node"), []byte("0\n"), 0o644))
		must(os.MkdirAll(filepath.Join(root, "sys/bus/pci/devices"), 0o755))
		must(os.Symlink(filepath.Join("../../../devices", path), filepath.Join(root, "sys/bus/pci/devices", id)))
	}
	for name, id := range nics {
		dir := filepath.Join(root, "sys/class/infiniband", name)
		must(os.MkdirAll(dir, 0o755))
		must(os.Symlink(filepath.Join("../../../devices", fns[id]), filepath.Join(dir, "device")))
	}
	return root
}

// A GPU region stripes over the NIC under its own PCIe switch only; host
// memory (both NICs on its node) over both.
func TestGPUAffinity(t *testing.T) {
	root := pciTree(t, map[string]string{
		"0000:03:00.0": "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", // GPU 0
		"0000:04:00.0": "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:04:00.0", // under its switch
		"0000:21:00.0": "pci0000:20/0000:20:01.0/0000:21:00.0",                           // another root complex
	}, map[string]string{"a0": "0000:21:00.0", "a1": "0000:04:00.0", "b0": "0000:21:00.0", "b1": "0000:04:00.0"})
	g := newRig(t, 16<<20, Config{Sysfs: topology.Sysfs{Root: root}, GPUBusID: func(dev int) (string, error) { return "0000:03:00.0", nil }})
	m := hostMem(g.src)
	m.Kind, m.Device = memory.CUDA, 0
	greg, err := g.a.Register(m)
	if err != nil {
		t.Fatal(err)
	}
	defer greg.Close()
	rr := railRegs(greg)
	if rr[0].Preferred || !rr[1].Preferred || rr[1].Affinity != topology.SameSwitch.String() || rr[0].Affinity != topology.SameNUMA.String() {
		t.Fatalf("GPU region rails: %+v", rr)
	}
	b := batch(100, 16<<20)
	if _, err := transport.Write(context.Background(), g.conn, greg, g.remote, b); err != nil {
		t.Fatal(err)
	}
	g.verify(t, b)
	st := g.a.RailStatus()
	if st[0].BytesSent != 0 || st[1].BytesSent != b.Bytes() {
		t.Fatalf("GPU batch went %d bytes on a0, %d on a1; want all on a1 (same switch)", st[0].BytesSent, st[1].BytesSent)
	}
	// The same-switch rail down: the batch goes on the next tier.
	g.f.rails["a1"].fault.Store(int32(refuse))
	clear(g.dst)
	if _, err := transport.Write(context.Background(), g.conn, greg, g.remote, b); err != nil {
		t.Fatal(err)
	}
	g.verify(t, b)
	if st := g.a.RailStatus(); st[0].BytesSent != b.Bytes() {
		t.Fatalf("after a1 failed, a0 carried %d of %d bytes", st[0].BytesSent, b.Bytes())
	}
	// Host memory: both NICs share its node (0), both are striped over.
	for _, x := range railRegs(g.sreg) {
		if !x.Preferred {
			t.Fatalf("host region rails: %+v", railRegs(g.sreg))
		}
	}
}

func railRegs(r transport.Registration) []transport.RailRegistration {
	return r.Rails()
}
