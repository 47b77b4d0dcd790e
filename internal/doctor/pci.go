package doctor

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// pciDev is a PCI function and its place in the topology.
type pciDev struct {
	bdf   string   // 0000:17:00.0
	chain []string // path under /sys/devices: "pci0000:16", "0000:16:01.0", ..., bdf
	numa  int
	name  string // RDMA device or "GPU"
}

var bdfRE = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// pciAt resolves a sysfs link (…/devices/BDF, …/infiniband/X/device) into
// its chain of PCI ancestors.
func (e *Env) pciAt(link string) (pciDev, bool) {
	real, err := filepath.EvalSymlinks(link)
	if err != nil {
		return pciDev{}, false
	}
	rootDevs, err := filepath.EvalSymlinks(e.p("sys/devices"))
	if err != nil {
		return pciDev{}, false
	}
	rel, err := filepath.Rel(rootDevs, real)
	if err != nil || strings.HasPrefix(rel, "..") {
		return pciDev{}, false
	}
	var chain []string
	for _, c := range strings.Split(rel, string(filepath.Separator)) {
		if strings.HasPrefix(c, "pci") || bdfRE.MatchString(c) {
			chain = append(chain, c)
		}
	}
	if len(chain) < 2 || !bdfRE.MatchString(chain[len(chain)-1]) {
		return pciDev{}, false
	}
	d := pciDev{bdf: chain[len(chain)-1], chain: chain, numa: -1}
	if s, err := os.ReadFile(filepath.Join(real, "numa_node")); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(s))); err == nil {
			d.numa = n
		}
	}
	return d, true
}

// readGPUs lists NVIDIA display/3D controllers on the PCI bus.
func readGPUs(e *Env) []pciDev {
	ents, err := os.ReadDir(e.p("sys/bus/pci/devices"))
	if err != nil {
		return nil
	}
	var out []pciDev
	for _, ent := range ents {
		dir := e.p("sys/bus/pci/devices", ent.Name())
		vendor, _ := os.ReadFile(filepath.Join(dir, "vendor"))
		class, _ := os.ReadFile(filepath.Join(dir, "class"))
		if strings.TrimSpace(string(vendor)) != "0x10de" || !strings.HasPrefix(strings.TrimSpace(string(class)), "0x03") {
			continue
		}
		if d, ok := e.pciAt(dir); ok {
			d.name = "GPU " + d.bdf
			out = append(out, d)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].bdf < out[b].bdf })
	return out
}

// nics lists the RDMA devices backed by a PCI function.
func (h *host) nics() []pciDev {
	seen := map[string]bool{}
	var out []pciDev
	for _, p := range h.ports {
		if seen[p.dev] {
			continue
		}
		seen[p.dev] = true
		if d, ok := h.env.pciAt(h.env.p(ibClass, p.dev, "device")); ok {
			d.name = p.dev
			out = append(out, d)
		}
	}
	return out
}

func (h *host) nvidiaVersion() (ver string, open bool) {
	ver, _ = h.env.read("sys/module/nvidia/version")
	s, err := h.env.read("proc/driver/nvidia/version")
	if err == nil {
		open = strings.Contains(s, "Open Kernel Module")
		if ver == "" {
			if m := regexp.MustCompile(`\b(\d{3,}\.\d+(\.\d+)?)\b`).FindString(s); m != "" {
				ver = m
			}
		}
	}
	return ver, open
}

func (h *host) moduleLoaded(name string) bool {
	if h.env.exists("sys/module", name) {
		return true
	}
	s, _ := h.env.read("proc/modules")
	for _, l := range strings.Split(s, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == name {
			return true
		}
	}
	return false
}

// kernelConfig returns a CONFIG_ value ("y", "m", "" when unset) and
// whether the kernel config could be read at all.
func (h *host) kernelConfig(key string) (string, bool) {
	rel, _ := h.env.read("proc/sys/kernel/osrelease")
	var data []byte
	if b, err := os.ReadFile(h.env.p("boot", "config-"+rel)); rel != "" && err == nil {
		data = b
	} else if f, err := os.Open(h.env.p("proc/config.gz")); err == nil {
		defer f.Close()
		if z, err := gzip.NewReader(f); err == nil {
			data, _ = io.ReadAll(io.LimitReader(z, 16<<20))
		}
	}
	if data == nil {
		return "", false
	}
	for _, l := range bytes.Split(data, []byte("\n")) {
		if v, ok := bytes.CutPrefix(l, []byte(key+"=")); ok {
			return string(v), true
		}
	}
	return "", true
}

func kernelAtLeast(rel string, major, minor int) bool {
	f := strings.FieldsFunc(rel, func(r rune) bool { return r == '.' || r == '-' })
	if len(f) < 2 {
		return false
	}
	a, err1 := strconv.Atoi(f[0])
	b, err2 := strconv.Atoi(f[1])
	return err1 == nil && err2 == nil && (a > major || a == major && b >= minor)
}

func (h *host) checkPeerMemory() Result {
	const c = "gpu-peer-memory"
	if len(h.gpus) == 0 {
		return res(c, Warn, "nothing to do for host memory; for GPU regions install the NVIDIA driver on a host with a GPU",
			"no NVIDIA GPU on the PCI bus: GPU regions are unavailable and b2bd serves host memory only")
	}
	if !h.moduleLoaded("nvidia") {
		return res(c, Warn, "install and load the NVIDIA driver (modprobe nvidia; nvidia-smi should list the GPUs)",
			"%d NVIDIA GPU(s) but the nvidia kernel module is not loaded: GPU regions are unavailable", len(h.gpus))
	}
	ver, open := h.nvidiaVersion()
	flavour := "proprietary"
	if open {
		flavour = "open"
	}
	drv := fmt.Sprintf("driver %s (%s kernel module)", orUnknown(ver), flavour)
	if h.moduleLoaded("nvidia_peermem") {
		return res(c, Pass, "", "%d GPU(s), %s, nvidia-peermem loaded: the NIC can DMA GPU memory", len(h.gpus), drv)
	}
	rel, _ := h.env.read("proc/sys/kernel/osrelease")
	dmabuf, known := h.kernelConfig("CONFIG_DMA_SHARED_BUFFER")
	major, _ := strconv.Atoi(strings.SplitN(ver, ".", 2)[0])
	var why []string
	if !open {
		why = append(why, "the driver is not the open kernel module")
	}
	if major < 515 {
		why = append(why, fmt.Sprintf("driver %s is older than 515", orUnknown(ver)))
	}
	if !kernelAtLeast(rel, 5, 12) {
		why = append(why, fmt.Sprintf("kernel %s is older than 5.12", orUnknown(rel)))
	}
	if known && dmabuf != "y" {
		why = append(why, "CONFIG_DMA_SHARED_BUFFER is not y")
	}
	if len(why) == 0 {
		cfg := "kernel config not readable"
		if known {
			cfg = "CONFIG_DMA_SHARED_BUFFER=y"
		}
		return res(c, Pass, "", "%d GPU(s), %s, kernel %s (%s): dma-buf export for GPU memory registration", len(h.gpus), drv, rel, cfg)
	}
	sev := Fail
	tail := ""
	if len(h.ports) == 0 {
		sev, tail = Warn, " (no RDMA device here, so GPU memory moves over TCP through host staging anyway)"
	}
	return res(c, sev, "modprobe nvidia-peermem (it ships with the driver; add it to /etc/modules-load.d), or use the open kernel modules >= 515 on kernel >= 5.12 for dma-buf",
		"%d GPU(s), %s: nvidia-peermem is not loaded and dma-buf is unavailable (%s), so the NIC cannot register GPU memory%s", len(h.gpus), drv, strings.Join(why, "; "), tail)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func (h *host) checkIOMMU() Result {
	const c = "iommu"
	cmdline, _ := h.env.read("proc/cmdline")
	args := map[string]string{}
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		args[k] = v
	}
	if args["iommu"] == "pt" || args["iommu.passthrough"] == "1" {
		return res(c, Pass, "", "IOMMU in passthrough mode (iommu=pt on the kernel command line)")
	}
	if args["iommu"] == "off" || args["intel_iommu"] == "off" || args["amd_iommu"] == "off" {
		return res(c, Pass, "", "IOMMU off on the kernel command line: device DMA is not translated")
	}
	groups, _ := filepath.Glob(h.env.p("sys/kernel/iommu_groups/*/type"))
	units, _ := os.ReadDir(h.env.p("sys/class/iommu"))
	var translated []string
	for _, g := range groups {
		b, err := os.ReadFile(g)
		if err != nil {
			continue
		}
		if t := strings.TrimSpace(string(b)); strings.HasPrefix(t, "DMA") {
			translated = append(translated, filepath.Base(filepath.Dir(g))+"="+t)
		}
	}
	const fix = "add iommu=pt to the kernel command line (GRUB_CMDLINE_LINUX, then update-grub and reboot); keep intel_iommu=on/amd_iommu=on if VFIO needs the IOMMU"
	if len(translated) > 0 {
		sort.Strings(translated)
		if len(translated) > 4 {
			translated = append(translated[:4], fmt.Sprintf("and %d more", len(translated)-4))
		}
		return res(c, Warn, fix, "the IOMMU translates device DMA (groups %s): GPUDirect RDMA and NIC DMA pay IOTLB misses, up to half the bandwidth", strings.Join(translated, ", "))
	}
	if len(groups) > 0 {
		return res(c, Pass, "", "IOMMU groups use identity (passthrough) domains")
	}
	if len(units) == 0 {
		return res(c, Pass, "", "no IOMMU active (/sys/class/iommu empty, no IOMMU groups): device DMA is not translated")
	}
	return res(c, Warn, fix, "IOMMU units present (%d) but their DMA mode is unknown (no /sys/kernel/iommu_groups/*/type)", len(units))
}

// pathBridges are the PCI functions strictly between a and b in the tree:
// each one's ancestors below their common ancestor, plus that ancestor when
// it is a PCI function (a switch port) rather than the host bridge.
func pathBridges(a, b pciDev) (bridges []string, common int) {
	for common < len(a.chain) && common < len(b.chain) && a.chain[common] == b.chain[common] {
		common++
	}
	add := func(c []string) {
		for i := max(common, 1); i < len(c)-1; i++ {
			bridges = append(bridges, c[i])
		}
	}
	if common >= 2 {
		bridges = append(bridges, a.chain[common-1])
	}
	add(a.chain)
	add(b.chain)
	return dedup(bridges), common
}

// acsCtrl finds the ACS extended capability in a function's config space
// and returns its control register; ok is false when there is none, known
// false when the extended space cannot be read (not root).
func acsCtrl(cfg []byte) (ctrl uint16, ok, known bool) {
	if len(cfg) < 0x104 {
		return 0, false, false
	}
	off := 0x100
	for n := 0; n < 64 && off >= 0x100 && off+8 <= len(cfg); n++ {
		hdr := binary.LittleEndian.Uint32(cfg[off:])
		if hdr == 0 || hdr == 0xffffffff {
			break
		}
		if hdr&0xffff == 0x000d {
			return binary.LittleEndian.Uint16(cfg[off+6:]), true, true
		}
		off = int(hdr >> 20 & 0xffc)
	}
	return 0, false, true
}

// pairs picks, for each GPU, the nearest RDMA NIC.
func (h *host) pairs() [][2]pciDev {
	nics := h.nics()
	var out [][2]pciDev
	for _, g := range h.gpus {
		best, bestScore := -1, -1
		for i, n := range nics {
			_, common := pathBridges(g, n)
			score := common * 2
			if g.numa == n.numa {
				score++
			}
			if score > bestScore {
				best, bestScore = i, score
			}
		}
		if best >= 0 {
			out = append(out, [2]pciDev{g, nics[best]})
		}
	}
	return out
}

func (h *host) gpuNICMissing(c string) (Result, bool) {
	switch {
	case len(h.gpus) == 0 && len(h.ports) == 0:
		return res(c, Warn, "nothing to do without GPUDirect; it needs an NVIDIA GPU and an RDMA NIC", "not checked: no NVIDIA GPU and no RDMA device"), true
	case len(h.gpus) == 0:
		return res(c, Warn, "nothing to do for host memory; GPUDirect needs an NVIDIA GPU", "not checked: no NVIDIA GPU"), true
	case len(h.ports) == 0:
		return res(c, Warn, noRDMAFix, "not checked: no RDMA device (GPU memory moves over TCP through host staging)"), true
	case len(h.nics()) == 0:
		return res(c, Warn, "nothing to do for a software RDMA device (rxe, siw); GPUDirect needs a PCIe RDMA NIC", "not checked: no RDMA device is a PCI function (software RDMA cannot DMA GPU memory)"), true
	}
	return Result{}, false
}

func (h *host) checkACS() Result {
	const c = "acs"
	if r, skip := h.gpuNICMissing(c); skip {
		return r
	}
	var redirect, unknown []string
	checked := 0
	for _, pr := range h.pairs() {
		bridges, _ := pathBridges(pr[0], pr[1])
		for _, b := range bridges {
			cfg, err := os.ReadFile(h.env.p("sys/bus/pci/devices", b, "config"))
			if err != nil {
				unknown = append(unknown, b)
				continue
			}
			ctrl, ok, known := acsCtrl(cfg)
			if !known {
				unknown = append(unknown, b)
				continue
			}
			checked++
			if ok && ctrl&(1<<2|1<<3) != 0 { // Request Redirect, Completion Redirect
				redirect = append(redirect, fmt.Sprintf("%s (ACSCtl %#04x) between %s and %s", b, ctrl, pr[0].name, pr[1].name))
			}
		}
	}
	redirect, unknown = dedup(redirect), dedup(unknown)
	if len(redirect) > 0 {
		return res(c, Warn, "disable ACS redirection on those switch ports (BIOS, or setpci -s BDF ECAP_ACS+6.w=0 at boot) unless VMs need the isolation",
			"ACS request/completion redirect enabled on %s: GPU–NIC peer traffic is sent up to the root complex, often halving GPUDirect bandwidth", strings.Join(redirect, "; "))
	}
	if len(unknown) > 0 {
		return res(c, Warn, "run doctor as root (sysfs shows PCIe extended config space only to root), or check with lspci -vvv | grep ACSCtl",
			"ACS unknown on %s: cannot read its PCIe extended configuration space", strings.Join(unknown, ", "))
	}
	if checked == 0 {
		return res(c, Pass, "", "no PCIe bridge between the GPU and the NIC below the host bridge: ACS does not apply")
	}
	return res(c, Pass, "", "no ACS redirection on the %d bridge(s) between each GPU and its nearest NIC", checked)
}

func (h *host) checkDistance() Result {
	const c = "pcie-distance"
	if r, skip := h.gpuNICMissing(c); skip {
		return r
	}
	worst := Pass
	var lines []string
	for _, pr := range h.pairs() {
		g, n := pr[0], pr[1]
		_, common := pathBridges(g, n)
		var rel string
		st := Pass
		switch {
		case common >= 2:
			rel = "same PCIe switch"
		case common == 1:
			rel, st = "same root complex, no shared switch (traffic crosses the host bridge)", Warn
		case g.numa == n.numa:
			rel, st = fmt.Sprintf("different root complexes on the same NUMA node %d (traffic crosses the CPU)", g.numa), Warn
		default:
			rel, st = fmt.Sprintf("different NUMA nodes (%d and %d): traffic crosses the inter-socket link", g.numa, n.numa), Warn
		}
		if st == Warn {
			worst = Warn
		}
		lines = append(lines, fmt.Sprintf("%s – %s (%s): %s", g.name, n.name, n.bdf, rel))
	}
	if worst == Warn {
		return res(c, Warn, "pin each GPU's transfers to a NIC under the same PCIe switch (--rdma-device), or move the cards; across sockets prefer host staging",
			"%s", strings.Join(lines, "; "))
	}
	return res(c, Pass, "", "%s", strings.Join(lines, "; "))
}
