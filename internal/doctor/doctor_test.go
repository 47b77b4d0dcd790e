package doctor

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// tree is a fake root: sysfs, procfs, /etc, /usr and the shm directory of a
// healthy GPUDirect host (an NVIDIA GPU and a ConnectX NIC under one PCIe
// switch, RoCE v2 on eth0 with MTU 9000, nvidia-peermem, iommu=pt).
type tree struct {
	t    *testing.T
	root string
}

func (tr tree) write(path, data string) {
	tr.t.Helper()
	p := filepath.Join(tr.root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr tree) link(path, target string) {
	tr.t.Helper()
	p := filepath.Join(tr.root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	_ = os.Remove(p)
	if err := os.Symlink(target, p); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr tree) rm(path string) {
	tr.t.Helper()
	if err := os.RemoveAll(filepath.Join(tr.root, path)); err != nil {
		tr.t.Fatal(err)
	}
}

const (
	rootPort = "pci0000:00/0000:00:01.0"
	swUp     = rootPort + "/0000:01:00.0"
	gpuPath  = swUp + "/0000:02:00.0/0000:03:00.0"
	nicPath  = swUp + "/0000:02:01.0/0000:04:00.0"
	port1    = "sys/class/infiniband/mlx5_0/ports/1/"
)

// acsConfig is a bridge's config space with an ACS capability at 0x100.
func acsConfig(ctrl uint16) string {
	b := make([]byte, 0x200)
	binary.LittleEndian.PutUint32(b[0x100:], 0x000d|1<<16) // ACS, version 1, last capability
	binary.LittleEndian.PutUint16(b[0x106:], ctrl)
	return string(b)
}

func (tr tree) pciDev(path string, files map[string]string) {
	bdf := filepath.Base(path)
	for k, v := range files {
		tr.write(filepath.Join("sys/devices", path, k), v)
	}
	tr.link("sys/bus/pci/devices/"+bdf, "../../../devices/"+path)
}

func healthy(t *testing.T) tree {
	tr := tree{t: t, root: t.TempDir()}
	// PCI: root port, switch, GPU and NIC below it.
	for _, b := range []string{rootPort, swUp, swUp + "/0000:02:00.0", swUp + "/0000:02:01.0"} {
		tr.pciDev(b, map[string]string{"config": acsConfig(0x0001), "vendor": "0x8086\n", "class": "0x060400\n", "numa_node": "0\n"})
	}
	tr.pciDev(gpuPath, map[string]string{"vendor": "0x10de\n", "class": "0x030200\n", "numa_node": "0\n"})
	tr.pciDev(nicPath, map[string]string{"vendor": "0x15b3\n", "class": "0x020000\n", "numa_node": "0\n"})
	// RDMA device mlx5_0 on the NIC, port 1 RoCE on eth0.
	tr.link("sys/class/infiniband/mlx5_0/device", "../../../devices/"+nicPath)
	tr.write(port1+"state", "4: ACTIVE\n")
	tr.write(port1+"phys_state", "5: LinkUp\n")
	tr.write(port1+"link_layer", "Ethernet\n")
	gids := []struct{ gid, typ string }{
		{"fe80:0000:0000:0000:5254:00ff:fe77:0001", "IB/RoCE v1"},
		{"fe80:0000:0000:0000:5254:00ff:fe77:0001", "RoCE v2"},
		{"0000:0000:0000:0000:0000:ffff:0a4d:0001", "IB/RoCE v1"},
		{"0000:0000:0000:0000:0000:ffff:0a4d:0001", "RoCE v2"},
	}
	for i, g := range gids {
		n := string(rune('0' + i))
		tr.write(port1+"gids/"+n, g.gid+"\n")
		tr.write(port1+"gid_attrs/types/"+n, g.typ+"\n")
		tr.write(port1+"gid_attrs/ndevs/"+n, "eth0\n")
	}
	tr.write(port1+"gids/4", "0000:0000:0000:0000:0000:0000:0000:0000\n")
	tr.write("sys/class/net/eth0/mtu", "9000\n")
	// rdma-core.
	tr.write("usr/lib/x86_64-linux-gnu/libibverbs.so.1", "")
	tr.write("usr/lib/x86_64-linux-gnu/libibverbs/libmlx5-rdmav34.so", "")
	tr.write("usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so", "")
	tr.write("etc/libibverbs.d/mlx5.driver", "driver mlx5\n")
	// NVIDIA driver with nvidia-peermem.
	tr.write("sys/module/nvidia/version", "550.54.15\n")
	tr.write("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n")
	tr.write("proc/modules", "nvidia_peermem 16384 0 - Live 0x0\nnvidia 56823808 3 nvidia_peermem, Live 0x0\nib_core 458752 1 nvidia_peermem, Live 0x0\n")
	tr.write("sys/module/nvidia_peermem/refcnt", "0\n")
	tr.write("proc/sys/kernel/osrelease", "6.1.0-18-amd64\n")
	tr.write("boot/config-6.1.0-18-amd64", "CONFIG_DMA_SHARED_BUFFER=y\n")
	tr.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro iommu=pt intel_iommu=on\n")
	tr.write("sys/kernel/iommu_groups/0/type", "identity\n")
	tr.write("proc/meminfo", "MemTotal:       263921092 kB\nHugePages_Total:       0\nHugePages_Free:        0\nHugepagesize:       2048 kB\n")
	tr.write("sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n")
	tr.write("proc/self/status", "Name:\tb2bd\nCapEff:\t0000000000000000\n")
	shm := filepath.Join(tr.root, "dev/shm/b2bd")
	if err := os.MkdirAll(shm, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shm, os.ModeDir|os.ModeSetgid|0o770); err != nil {
		t.Fatal(err)
	}
	return tr
}

func healthyEnv(root string) Env {
	return Env{
		Root:        root,
		Memlock:     func() (uint64, error) { return Unlimited, nil },
		Statfs:      func(string) (FS, error) { return FS{Type: Tmpfs, Free: 32 << 30, Total: 64 << 30}, nil },
		LookupGroup: func(string) (int, error) { return os.Getegid(), nil },
		PortMTU:     func(string, int) (int, error) { return 4096, nil },
	}
}

func byCheck(rs []Result) map[string]Result {
	m := map[string]Result{}
	for _, r := range rs {
		m[r.Check] = r
	}
	return m
}

func TestHealthyTree(t *testing.T) {
	tr := healthy(t)
	rs := Run(healthyEnv(tr.root))
	if len(rs) != 11 {
		t.Fatalf("%d results, want 11", len(rs))
	}
	for _, r := range rs {
		if r.Status != Pass {
			t.Errorf("%s: %s: %s (fix: %s)", r.Check, r.Status, r.Detail, r.Fix)
		}
	}
	m := byCheck(rs)
	for check, want := range map[string]string{
		"roce-gid":          "RoCE v2 GID index 3 10.77.0.1 on eth0",
		"mtu":               "eth0 MTU 9000, RDMA active MTU 4096 (ibv_query_port)",
		"pcie-distance":     "same PCIe switch",
		"acs":               "no ACS redirection on the 3 bridge(s)",
		"gpu-peer-memory":   "nvidia-peermem loaded",
		"ibverbs-providers": "providers in /usr/lib/x86_64-linux-gnu/libibverbs",
	} {
		if !strings.Contains(m[check].Detail, want) {
			t.Errorf("%s: detail %q lacks %q", check, m[check].Detail, want)
		}
	}
}

// TestFailingTrees breaks the healthy tree one way per case and asserts the
// check that must notice it, its status, and its fix.
func TestFailingTrees(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(tr tree, env *Env)
		check  string
		status Status
		detail string // substring of the detail
		fix    string // substring of the fix
	}{
		{"port down", func(tr tree, _ *Env) {
			tr.write(port1+"state", "1: DOWN\n")
			tr.write(port1+"phys_state", "3: Disabled\n")
		},
			"rdma-devices", Fail, "no RDMA port is ACTIVE: mlx5_0/1 DOWN, phys Disabled", "ip link set"},
		{"no rdma device", func(tr tree, _ *Env) { tr.rm("sys/class/infiniband") },
			"rdma-devices", Warn, "no RDMA devices", "rdma link add"},
		{"named device missing", func(_ tree, e *Env) { e.Device = "mlx5_9" },
			"rdma-devices", Fail, "--rdma-device mlx5_9", "ibv_devices"},
		{"no RoCE v2 GID", func(tr tree, _ *Env) {
			tr.write(port1+"gid_attrs/types/1", "IB/RoCE v1\n")
			tr.write(port1+"gid_attrs/types/3", "IB/RoCE v1\n")
		}, "roce-gid", Fail, "no RoCE v2 GID with a netdev", "ip addr add"},
		{"GID of another netdev", func(_ tree, e *Env) { e.NetDev = "eth1"; e.PortMTU = nil },
			"roce-gid", Fail, "for eth1", "dev eth1"},
		{"link-local GID only", func(tr tree, _ *Env) { tr.rm(port1 + "gids/3"); tr.rm(port1 + "gids/2") },
			"roce-gid", Warn, "only link-local RoCE v2 GIDs", "routable address"},
		{"netdev MTU 1500", func(tr tree, e *Env) { tr.write("sys/class/net/eth0/mtu", "1500\n"); e.PortMTU = nil },
			"mtu", Warn, "eth0 MTU 1500 gives RDMA active MTU 1024", "mtu 9000"},
		{"port MTU behind netdev", func(_ tree, e *Env) { e.PortMTU = func(string, int) (int, error) { return 1024, nil } },
			"mtu", Warn, "active MTU 1024 (ibv_query_port) but eth0 MTU 9000 allows 4096", "re-add"},
		{"no provider for the device", func(tr tree, _ *Env) { tr.rm("usr/lib/x86_64-linux-gnu/libibverbs/libmlx5-rdmav34.so") },
			"ibverbs-providers", Fail, "mlx5_0 needs libmlx5-rdmav*.so", "ibverbs-providers"},
		{"no providers at all", func(tr tree, _ *Env) { tr.rm("usr/lib/x86_64-linux-gnu/libibverbs"); tr.rm("etc/libibverbs.d") },
			"ibverbs-providers", Fail, "providers are missing", "apt install"},
		{"no libibverbs", func(tr tree, _ *Env) { tr.rm("usr/lib/x86_64-linux-gnu/libibverbs.so.1") },
			"ibverbs-providers", Fail, "libibverbs.so.1 not found", "libibverbs1"},
		{"memlock small", func(_ tree, e *Env) { e.Memlock = func() (uint64, error) { return 64 << 10, nil } },
			"memlock", Warn, "RLIMIT_MEMLOCK is 64 KiB", "LimitMEMLOCK=infinity"},
		{"memlock finite", func(_ tree, e *Env) { e.Memlock = func() (uint64, error) { return 8 << 30, nil } },
			"memlock", Warn, "8 GiB, not unlimited", "LimitMEMLOCK=infinity"},
		{"no peermem, old proprietary driver", func(tr tree, _ *Env) {
			tr.write("proc/modules", "nvidia 56823808 0 - Live 0x0\n")
			tr.rm("sys/module/nvidia_peermem")
			tr.write("sys/module/nvidia/version", "470.223.02\n")
		}, "gpu-peer-memory", Fail, "nvidia-peermem is not loaded and dma-buf is unavailable (the driver is not the open kernel module; driver 470.223.02 is older than 515)", "modprobe nvidia-peermem"},
		{"no peermem, kernel without dma-buf", func(tr tree, _ *Env) {
			tr.write("proc/modules", "nvidia 56823808 0 - Live 0x0\n")
			tr.rm("sys/module/nvidia_peermem")
			tr.write("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15\n")
			tr.write("proc/sys/kernel/osrelease", "5.10.0-28-amd64\n")
			tr.write("boot/config-5.10.0-28-amd64", "# CONFIG_DMA_SHARED_BUFFER is not set\n")
		}, "gpu-peer-memory", Fail, "kernel 5.10.0-28-amd64 is older than 5.12; CONFIG_DMA_SHARED_BUFFER is not y", "open kernel modules"},
		{"nvidia driver not loaded", func(tr tree, _ *Env) {
			tr.rm("sys/module/nvidia")
			tr.write("proc/modules", "")
			tr.rm("sys/module/nvidia_peermem")
		},
			"gpu-peer-memory", Warn, "nvidia kernel module is not loaded", "modprobe nvidia"},
		{"no GPU", func(tr tree, _ *Env) { tr.rm("sys/bus/pci/devices/0000:03:00.0") },
			"gpu-peer-memory", Warn, "no NVIDIA GPU", "host memory"},
		{"IOMMU translating", func(tr tree, _ *Env) {
			tr.write("proc/cmdline", "root=/dev/sda1 intel_iommu=on\n")
			tr.write("sys/kernel/iommu_groups/0/type", "DMA-FQ\n")
		}, "iommu", Warn, "translates device DMA (groups 0=DMA-FQ)", "iommu=pt"},
		{"IOMMU mode unknown", func(tr tree, _ *Env) {
			tr.write("proc/cmdline", "root=/dev/sda1\n")
			tr.rm("sys/kernel/iommu_groups")
			tr.write("sys/class/iommu/dmar0/name", "dmar0\n")
		}, "iommu", Warn, "mode is unknown", "iommu=pt"},
		{"ACS redirect on the switch", func(tr tree, _ *Env) {
			tr.write("sys/devices/"+swUp+"/0000:02:00.0/config", acsConfig(0x001d))
		}, "acs", Warn, "ACS request/completion redirect enabled on 0000:02:00.0 (ACSCtl 0x001d) between GPU 0000:03:00.0 and mlx5_0", "setpci"},
		{"ACS unreadable (not root)", func(tr tree, _ *Env) {
			tr.write("sys/devices/"+swUp+"/config", string(make([]byte, 64)))
		}, "acs", Warn, "ACS unknown on 0000:01:00.0", "as root"},
		{"ACS without a NIC", func(tr tree, _ *Env) { tr.rm("sys/class/infiniband") },
			"acs", Warn, "no RDMA device", "rdma link add"},
		{"NIC on the other socket", func(tr tree, _ *Env) {
			far := "pci0000:80/0000:80:01.0/0000:81:00.0"
			tr.pciDev(far, map[string]string{"vendor": "0x15b3\n", "class": "0x020000\n", "numa_node": "1\n"})
			tr.link("sys/class/infiniband/mlx5_0/device", "../../../devices/"+far)
		}, "pcie-distance", Warn, "different NUMA nodes (0 and 1)", "--rdma-device"},
		{"NIC on another root complex, same node", func(tr tree, _ *Env) {
			far := "pci0000:40/0000:40:01.0/0000:41:00.0"
			tr.pciDev(far, map[string]string{"vendor": "0x15b3\n", "class": "0x020000\n", "numa_node": "0\n"})
			tr.link("sys/class/infiniband/mlx5_0/device", "../../../devices/"+far)
		}, "pcie-distance", Warn, "different root complexes on the same NUMA node 0", "same PCIe switch"},
		{"NIC under the root port only", func(tr tree, _ *Env) {
			near := "pci0000:00/0000:00:02.0/0000:05:00.0"
			tr.pciDev(near, map[string]string{"vendor": "0x15b3\n", "class": "0x020000\n", "numa_node": "0\n"})
			tr.link("sys/class/infiniband/mlx5_0/device", "../../../devices/"+near)
		}, "pcie-distance", Warn, "same root complex, no shared switch", "same PCIe switch"},
		{"software RDMA only", func(tr tree, _ *Env) { tr.rm("sys/class/infiniband/mlx5_0/device") },
			"pcie-distance", Warn, "no RDMA device is a PCI function", "software RDMA"},
		{"hugetlb eats memory", func(tr tree, _ *Env) {
			tr.write("proc/meminfo", "MemTotal:       16000000 kB\nHugePages_Total:    5000\nHugepagesize:       2048 kB\n")
		}, "hugepages", Warn, "more than half of memory", "vm.nr_hugepages"},
		{"shm dir world-accessible", func(tr tree, _ *Env) {
			if err := os.Chmod(filepath.Join(tr.root, "dev/shm/b2bd"), 0o777); err != nil {
				t.Fatal(err)
			}
		}, "shm-dir", Fail, "other users can open every host region", "chmod 2770"},
		{"shm dir a file", func(tr tree, _ *Env) { tr.rm("dev/shm/b2bd"); tr.write("dev/shm/b2bd", "x") },
			"shm-dir", Fail, "is not a directory", "--shm-dir"},
		{"shm dir not tmpfs", func(_ tree, e *Env) {
			e.Statfs = func(string) (FS, error) { return FS{Type: 0xef53, Free: 1 << 40}, nil }
		},
			"shm-dir", Warn, "not on tmpfs (statfs type 0xef53)", "tmpfs"},
		{"shm tmpfs nearly full", func(_ tree, e *Env) {
			e.Statfs = func(string) (FS, error) { return FS{Type: Tmpfs, Free: 100 << 20, Total: 64 << 20 << 10}, nil }
		}, "shm-dir", Warn, "only 100 MiB free of 64 GiB", "remount,size="},
		{"no b2bd group", func(_ tree, e *Env) {
			e.LookupGroup = func(string) (int, error) { return 0, errors.New("unknown group") }
		},
			"shm-dir", Warn, "no group b2bd", "groupadd --system b2bd"},
		{"shm dir of another group", func(_ tree, e *Env) { e.LookupGroup = func(string) (int, error) { return os.Getegid() + 1, nil } },
			"shm-dir", Warn, "group is gid", "groupadd"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := healthy(t)
			env := healthyEnv(tr.root)
			tc.break_(tr, &env)
			m := byCheck(Run(env))
			r, ok := m[tc.check]
			if !ok {
				t.Fatalf("no result for %s", tc.check)
			}
			if r.Status != tc.status {
				t.Errorf("%s: status %s, want %s (%s)", tc.check, r.Status, tc.status, r.Detail)
			}
			if !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("%s: detail %q lacks %q", tc.check, r.Detail, tc.detail)
			}
			if r.Fix == "" || !strings.Contains(r.Fix, tc.fix) {
				t.Errorf("%s: fix %q lacks %q", tc.check, r.Fix, tc.fix)
			}
			// Breaking one thing never makes another check fail.
			for _, o := range m {
				if o.Check != tc.check && o.Status == Fail {
					t.Errorf("unrelated %s failed: %s", o.Check, o.Detail)
				}
			}
		})
	}
}

// TestResolveGroup: doctor resolves --group as the daemon does, so a numeric
// group without an /etc/group entry (the k8s ConfigMap's 2470) is a gid.
func TestResolveGroup(t *testing.T) {
	lookup := func(name string) (int, error) {
		if name == "b2bd" {
			return 991, nil
		}
		return 0, errors.New("group: unknown group " + name)
	}
	cases := []struct {
		spec string
		want int
		err  string // substring; "" means no error
	}{
		{"b2bd", 991, ""},
		{"2470", 2470, ""},
		{"0", 0, ""},
		{"nosuch", 0, `look up group "nosuch": group: unknown group nosuch`},
		{"4294967295", 0, "is not a gid"},
	}
	for _, tc := range cases {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := resolveGroup(tc.spec, lookup)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("resolveGroup(%q) = %d, %v; want error with %q", tc.spec, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("resolveGroup(%q) = %d, %v; want %d", tc.spec, got, err, tc.want)
			}
		})
	}

	// End to end: a numeric group absent from /etc/group that owns the shm dir passes.
	tr := healthy(t)
	env := healthyEnv(tr.root)
	env.Group = strconv.Itoa(os.Getegid())
	env.LookupGroup = func(string) (int, error) { return 0, errors.New("unknown group") }
	if r := byCheck(Run(env))["shm-dir"]; r.Status != Pass {
		t.Fatalf("numeric --group %s: %+v", env.Group, r)
	}
}

func TestDMABufPasses(t *testing.T) {
	tr := healthy(t)
	tr.write("proc/modules", "nvidia 56823808 0 - Live 0x0\n")
	tr.rm("sys/module/nvidia_peermem")
	tr.write("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15\n")
	r := byCheck(Run(healthyEnv(tr.root)))["gpu-peer-memory"]
	if r.Status != Pass || !strings.Contains(r.Detail, "dma-buf") || !strings.Contains(r.Detail, "CONFIG_DMA_SHARED_BUFFER=y") {
		t.Fatalf("got %+v", r)
	}
}

func TestCommandExitAndJSON(t *testing.T) {
	tr := healthy(t)
	tr.write(port1+"state", "1: DOWN\n")
	var out, errb bytes.Buffer
	err := Command(context.Background(), "b2bd", []string{"--json", "--root", tr.root}, &out, &errb)
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("err = %v, want ErrFailed; stderr %s", err, errb.String())
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("json: %v\n%s", err, out.String())
	}
	if rep.Root != tr.root || len(rep.Checks) != 11 || rep.Summary.Fail < 1 {
		t.Fatalf("report %+v", rep)
	}
	if m := byCheck(rep.Checks); m["rdma-devices"].Status != Fail || m["rdma-devices"].Fix == "" {
		t.Fatalf("rdma-devices %+v", m["rdma-devices"])
	}
	// Text: one line per check, the fix under a failing one, the summary.
	out.Reset()
	err = Command(context.Background(), "b2bd", []string{"--root", tr.root}, &out, &errb)
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("err = %v", err)
	}
	txt := out.String()
	if !strings.Contains(txt, "FAIL  rdma-devices") || !strings.Contains(txt, "fix: bring the link up") || !strings.Contains(txt, " fail\n") {
		t.Fatalf("text:\n%s", txt)
	}
	if err := Command(context.Background(), "b2bd", []string{"extra"}, &out, &errb); err == nil {
		t.Fatal("stray argument accepted")
	}
}

func TestRoceMTU(t *testing.T) {
	for mtu, want := range map[int]int{1500: 1024, 4200: 4096, 9000: 4096, 2200: 2048, 1100: 512, 300: 0, 4187: 2048, 4188: 4096} {
		if got := roceMTU(mtu); got != want {
			t.Errorf("roceMTU(%d) = %d, want %d", mtu, got, want)
		}
	}
}

func FuzzACSCtrl(f *testing.F) {
	f.Add([]byte(acsConfig(0x1d)))
	f.Add(make([]byte, 64))
	f.Add(make([]byte, 0x104))
	loop := make([]byte, 0x200)
	binary.LittleEndian.PutUint32(loop[0x100:], 0x0001|0x100<<20) // points at itself
	f.Add(loop)
	f.Fuzz(func(t *testing.T, cfg []byte) {
		ctrl, ok, known := acsCtrl(cfg)
		if !known && (ok || len(cfg) >= 0x104) {
			t.Fatalf("known=false with ok=%v len=%d", ok, len(cfg))
		}
		if !ok && ctrl != 0 {
			t.Fatalf("ctrl %#x without a capability", ctrl)
		}
	})
}

// TestCommandConfig: doctor reads the daemon's config for the settings it
// shares (here --shm-dir), skips the daemon's other keys, and lets its own
// command line win.
func TestCommandConfig(t *testing.T) {
	tr := healthy(t)
	if err := os.Chmod(filepath.Join(tr.root, "dev/shm/b2bd"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(tr.root, "srv/regions"), 0o750); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "b2bd.toml")
	if err := os.WriteFile(cfg, []byte("shm-dir = \"/srv/regions\"\ntcp-streams = 4\npeer-listen = \":7470\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	shm := func(args ...string) Result {
		t.Helper()
		var out, errb bytes.Buffer
		_ = Command(context.Background(), "b2bd", append([]string{"--json", "--root", tr.root}, args...), &out, &errb)
		var rep Report
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatalf("json: %v (stderr %s)", err, errb.String())
		}
		return byCheck(rep.Checks)["shm-dir"]
	}
	if r := shm(); r.Status != Fail || !strings.Contains(r.Detail, "/dev/shm/b2bd is drwxrwxrwx") {
		t.Errorf("default shm dir: %+v", r)
	}
	if r := shm("--config", cfg); strings.Contains(r.Detail, "/dev/shm/b2bd") || r.Status == Fail {
		t.Errorf("with --config: %+v", r)
	}
	if r := shm("--config", cfg, "--shm-dir", "/dev/shm/b2bd"); r.Status != Fail {
		t.Errorf("command line over --config: %+v", r)
	}
	if err := os.WriteFile(cfg, []byte("insecure = \"no\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	err := Command(context.Background(), "b2bd", []string{"--config", cfg}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), `key "insecure"`) {
		t.Fatalf("bad config: %v", err)
	}
}

// TestCommandConfigRanges: b2bd doctor --config runs the daemon's own check,
// so a file the daemon refuses (a key outside its range, a key doctor has no
// flag for, flags that disagree) fails doctor, naming the key, the value and
// the range; a file the daemon takes passes the config check.
func TestCommandConfigRanges(t *testing.T) {
	tr := healthy(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name, file string
		want       []string // empty: the config check passes
	}{
		{"local-streams", "insecure = true\npeer-listen = \"127.0.0.1:7470\"\ndata-listen = \"127.0.0.1:7471\"\nlocal-streams = 99\n", []string{`"local-streams"`, `"99"`, "1 to 8"}},
		{"tcp-streams", "insecure = true\ntcp-streams = -3\n", []string{`"tcp-streams"`, `"-3"`, "1 to 64"}},
		{"max-descriptors", "max-descriptors = 0\n", []string{`"max-descriptors"`, `"0"`, "1 to 16777216"}},
		{"transport", "transport = \"rdma\"\n", []string{`"transport"`, `"rdma"`, "auto, tcp, verbs, local"}},
		{"no security", "shm-dir = \"/srv/regions\"\n", []string{"must authenticate each other"}},
		{"good", "insecure = true\npeer-listen = \"127.0.0.1:7470\"\ndata-listen = \"127.0.0.1:7471\"\nlocal-streams = 8\ntcp-streams = 2\n", nil},
	} {
		cfg := filepath.Join(dir, tc.name+".toml")
		if err := os.WriteFile(cfg, []byte(tc.file), 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		err := Command(context.Background(), "b2bd", []string{"--json", "--root", tr.root, "--config", cfg}, &out, &errb)
		var rep Report
		if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
			t.Fatalf("%s: json: %v (err %v, stderr %s)", tc.name, jerr, err, errb.String())
		}
		r, ok := byCheck(rep.Checks)["config"]
		if tc.want == nil {
			if !ok || r.Status != Pass {
				t.Errorf("%s: config check %+v (present %v), want pass", tc.name, r, ok)
			}
			continue
		}
		if !errors.Is(err, ErrFailed) || r.Status != Fail {
			t.Errorf("%s: err %v, config check %+v; want a failed config check", tc.name, err, r)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(r.Detail, w) || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: detail %q / err %v lack %q", tc.name, r.Detail, err, w)
			}
		}
	}
}
