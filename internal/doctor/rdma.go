package doctor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/b2bd/b2bd/verbs"
)

// port is one RDMA device port as sysfs shows it.
type port struct {
	dev       string
	num       int
	state     string // "ACTIVE" (sysfs: "4: ACTIVE")
	phys      string // "LinkUp"
	linkLayer string // "Ethernet" | "InfiniBand"
}

func (p port) String() string { return fmt.Sprintf("%s/%d", p.dev, p.num) }

const ibClass = "sys/class/infiniband"

// stateName keeps the name of sysfs's "4: ACTIVE".
func stateName(s string) string {
	if _, name, ok := strings.Cut(s, ":"); ok {
		return strings.TrimSpace(name)
	}
	return s
}

func readPorts(e *Env) ([]port, error) {
	devs, err := os.ReadDir(e.p(ibClass))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", e.p(ibClass), err)
	}
	var out []port
	for _, d := range devs {
		if e.Device != "" && d.Name() != e.Device {
			continue
		}
		nums, err := os.ReadDir(e.p(ibClass, d.Name(), "ports"))
		if err != nil {
			continue
		}
		for _, n := range nums {
			num, err := strconv.Atoi(n.Name())
			if err != nil {
				continue
			}
			pp := port{dev: d.Name(), num: num}
			dir := []string{ibClass, d.Name(), "ports", n.Name()}
			s, _ := e.read(append(dir, "state")...)
			pp.state = stateName(s)
			s, _ = e.read(append(dir, "phys_state")...)
			pp.phys = stateName(s)
			pp.linkLayer, _ = e.read(append(dir, "link_layer")...)
			out = append(out, pp)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].String() < out[b].String() })
	return out, nil
}

func (p port) active() bool { return p.state == "ACTIVE" || p.state == "ACTIVE_DEFER" }

// activePorts are the ports to check further: the active ones, or every
// port when none is active (so later checks still say something useful).
func (h *host) activePorts() []port {
	var out []port
	for _, p := range h.ports {
		if p.active() {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return h.ports
	}
	return out
}

const noRDMAFix = "for RDMA, load the NIC's driver (mlx5_ib, irdma, bnxt_re...) or add Soft-RoCE (rdma link add rxe0 type rxe netdev eth0); for TCP only, nothing to do"

func (h *host) checkRDMA() Result {
	const c = "rdma-devices"
	if h.rdmaErr != nil {
		return res(c, Warn, "run doctor where /sys is mounted, with read access", "cannot list RDMA devices: %v", h.rdmaErr)
	}
	if len(h.ports) == 0 {
		if h.env.Device != "" {
			return res(c, Fail, "name a device listed in /sys/class/infiniband (ibv_devices), or drop --rdma-device", "--rdma-device %s: no such RDMA device (or it has no ports)", h.env.Device)
		}
		return res(c, Warn, noRDMAFix, "no RDMA devices in /sys/class/infiniband: the verbs transport is off and b2bd moves data over TCP")
	}
	var up, down []string
	for _, p := range h.ports {
		s := fmt.Sprintf("%s %s (%s)", p, p.state, p.linkLayer)
		if p.active() {
			up = append(up, s)
		} else {
			down = append(down, fmt.Sprintf("%s %s, phys %s", p, p.state, p.phys))
		}
	}
	if len(up) == 0 {
		return res(c, Fail, "bring the link up: ip link set <netdev> up, check the cable and switch port (ibstat/ibv_devinfo show the state); InfiniBand ports need a subnet manager (opensm)",
			"no RDMA port is ACTIVE: %s", strings.Join(down, "; "))
	}
	d := "active: " + strings.Join(up, ", ")
	if len(down) > 0 {
		d += "; not active: " + strings.Join(down, "; ")
	}
	return res(c, Pass, "", "%s", d)
}

func (h *host) checkGID() Result {
	const c = "roce-gid"
	if len(h.ports) == 0 {
		return res(c, Warn, noRDMAFix, "not checked: no RDMA devices")
	}
	var oks, notes []string
	var linkLocalOnly, none []string
	for _, p := range h.activePorts() {
		if p.linkLayer == "InfiniBand" {
			notes = append(notes, fmt.Sprintf("%s is InfiniBand (GIDs come from the subnet manager)", p))
			continue
		}
		tab, err := verbs.ReadGIDTable(h.env.p(ibClass), p.dev, p.num)
		if err != nil {
			none = append(none, fmt.Sprintf("%s: %v", p, err))
			continue
		}
		var best *verbs.GIDEntry
		ll := false
		for i := range tab {
			g := tab[i]
			if !g.RoCEv2() || g.NetDev == "" || (h.env.NetDev != "" && g.NetDev != h.env.NetDev) {
				continue
			}
			if g.GID[0] == 0xfe && g.GID[1]&0xc0 == 0x80 { // fe80::/10
				ll = true
				continue
			}
			if best == nil || (isV4Mapped(g.GID) && !isV4Mapped(best.GID)) {
				best = &tab[i]
			}
		}
		switch {
		case best != nil:
			oks = append(oks, fmt.Sprintf("%s: RoCE v2 GID index %d %s on %s", p, best.Index, best.GID, best.NetDev))
		case ll:
			linkLocalOnly = append(linkLocalOnly, p.String())
		default:
			none = append(none, fmt.Sprintf("%s: %s", p, describeGIDs(tab)))
		}
	}
	nd := "the netdev"
	if h.env.NetDev != "" {
		nd = h.env.NetDev
	}
	switch {
	case len(oks) > 0:
		return res(c, Pass, "", "%s", strings.Join(append(oks, notes...), "; "))
	case len(linkLocalOnly) > 0:
		return res(c, Warn, fmt.Sprintf("give %s a routable address (ip addr add ADDR/PREFIX dev %s); the kernel then adds its RoCE v2 GID", nd, nd),
			"only link-local RoCE v2 GIDs on %s: traffic cannot be routed, and b2bd's automatic GID choice wants the netdev's IP address", strings.Join(linkLocalOnly, ", "))
	case len(none) > 0:
		return res(c, Fail, fmt.Sprintf("give %s an IP address and bring it up (ip addr add ADDR/PREFIX dev %s; ip link set %s up); a RoCE v1-only NIC needs RoCE v2 enabled (cma_roce_mode)", nd, nd, nd),
			"no RoCE v2 GID with a netdev%s: %s", forNetDev(h.env.NetDev), strings.Join(none, "; "))
	}
	return res(c, Pass, "", "%s", strings.Join(notes, "; "))
}

func forNetDev(n string) string {
	if n == "" {
		return ""
	}
	return " for " + n
}

func isV4Mapped(g verbs.GID) bool {
	for i := 0; i < 10; i++ {
		if g[i] != 0 {
			return false
		}
	}
	return g[10] == 0xff && g[11] == 0xff
}

func describeGIDs(tab []verbs.GIDEntry) string {
	if len(tab) == 0 {
		return "GID table empty"
	}
	var s []string
	for _, e := range tab {
		t := e.Type
		if t == "" {
			t = "type unknown"
		}
		nd := e.NetDev
		if nd == "" {
			nd = "no netdev"
		}
		s = append(s, fmt.Sprintf("%d=%s (%s, %s)", e.Index, e.GID, t, nd))
	}
	return "GIDs " + strings.Join(s, ", ")
}

// portNetDev is the netdev under an Ethernet port: from its GID table, else
// from the device's PCI net/ directory.
func (h *host) portNetDev(p port) string {
	if h.env.NetDev != "" {
		return h.env.NetDev
	}
	if nds := verbs.PortNetDevs(h.env.p(ibClass), p.dev, p.num); len(nds) > 0 {
		return nds[0]
	}
	if ents, err := os.ReadDir(h.env.p(ibClass, p.dev, "device", "net")); err == nil && len(ents) > 0 {
		return ents[0].Name()
	}
	return ""
}

// roceMTU is the RDMA MTU the kernel gives a RoCE port for a netdev MTU:
// the largest IB MTU that fits with the RoCE v2 headers (ib_core's
// iboe_get_mtu: GRH 40 + UDP 8 + BTH 12 + AtomicETH 28 + ICRC 4).
func roceMTU(netdevMTU int) int {
	room := netdevMTU - (40 + 8 + 12 + 28 + 4)
	for _, m := range []int{4096, 2048, 1024, 512, 256} {
		if room >= m {
			return m
		}
	}
	return 0
}

func (h *host) checkMTU() Result {
	const c = "mtu"
	if len(h.ports) == 0 {
		return res(c, Warn, noRDMAFix, "not checked: no RDMA devices")
	}
	var oks, warns []string
	var fix string
	for _, p := range h.activePorts() {
		if p.linkLayer == "InfiniBand" {
			oks = append(oks, fmt.Sprintf("%s is InfiniBand (MTU set by the subnet manager)", p))
			continue
		}
		nd := h.portNetDev(p)
		if nd == "" {
			warns = append(warns, fmt.Sprintf("%s: no netdev found for the port, MTU not checked", p))
			continue
		}
		s, err := h.env.read("sys/class/net", nd, "mtu")
		mtu, perr := strconv.Atoi(s)
		if err != nil || perr != nil {
			warns = append(warns, fmt.Sprintf("%s: cannot read %s's MTU (%v)", p, nd, errors.Join(err, perr)))
			continue
		}
		want := roceMTU(mtu)
		active, how := want, "derived from the netdev MTU"
		if h.env.PortMTU != nil {
			if a, err := h.env.PortMTU(p.dev, p.num); err == nil {
				active, how = a, "ibv_query_port"
			}
		}
		switch {
		case active != want:
			warns = append(warns, fmt.Sprintf("%s: active MTU %d (%s) but %s MTU %d allows %d", p, active, how, nd, mtu, want))
			fix = fmt.Sprintf("the port did not follow %s's MTU change: set the MTU before adding the RDMA link, or re-add it (rdma link delete/add; driver reload on NICs)", nd)
		case active < 4096:
			warns = append(warns, fmt.Sprintf("%s: %s MTU %d gives RDMA active MTU %d (%s); 4096 needs a netdev MTU of at least %d", p, nd, mtu, active, how, 4096+92))
			if fix == "" {
				fix = fmt.Sprintf("ip link set %s mtu 9000 on both hosts (and the switch ports), or accept %d-byte RDMA packets; b2bd uses the smaller of both ends' MTUs", nd, active)
			}
		default:
			oks = append(oks, fmt.Sprintf("%s: %s MTU %d, RDMA active MTU %d (%s)", p, nd, mtu, active, how))
		}
	}
	if len(warns) > 0 {
		return res(c, Warn, fix, "%s", strings.Join(append(warns, oks...), "; "))
	}
	return res(c, Pass, "", "%s", strings.Join(oks, "; "))
}

// libDirs are where distributions put libibverbs and its providers.
var libDirs = []string{"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib", "lib/x86_64-linux-gnu", "lib64"}

// providerOf maps an RDMA device name prefix to its rdma-core provider.
var providerOf = []struct{ prefix, provider string }{
	{"mlx5_", "mlx5"}, {"mlx4_", "mlx4"}, {"rxe", "rxe"}, {"siw", "siw"}, {"irdma", "irdma"}, {"i40iw", "i40iw"},
	{"bnxt_re", "bnxt_re"}, {"efa", "efa"}, {"erdma", "erdma"}, {"hns", "hns"}, {"mana", "mana"}, {"qedr", "qedr"},
	{"ocrdma", "ocrdma"}, {"vmw_pvrdma", "vmw_pvrdma"}, {"cxgb4", "cxgb4"}, {"hfi1", "hfi1verbs"}, {"qib", "ipathverbs"},
}

func (h *host) checkProviders() Result {
	const c = "ibverbs-providers"
	var lib, provDir string
	for _, d := range libDirs {
		if lib == "" && h.env.exists(d, "libibverbs.so.1") {
			lib = "/" + filepath.Join(d, "libibverbs.so.1")
		}
		if provDir == "" {
			if m, _ := filepath.Glob(h.env.p(d, "libibverbs", "*.so")); len(m) > 0 {
				provDir = d + "/libibverbs"
			}
		}
	}
	drivers, _ := filepath.Glob(h.env.p("etc/libibverbs.d", "*.driver"))
	sev := Warn
	if len(h.ports) > 0 {
		sev = Fail
	}
	const install = "apt install libibverbs1 ibverbs-providers (rdma-core on RPM distributions)"
	if lib == "" {
		return res(c, sev, install, "libibverbs.so.1 not found in %s: b2bd cannot load verbs and sees 0 RDMA devices", strings.Join(libDirs, ", "))
	}
	if provDir == "" || len(drivers) == 0 {
		return res(c, sev, install, "libibverbs is at %s but the providers are missing (provider libraries: %t, /etc/libibverbs.d entries: %d): verbs would list 0 devices", lib, provDir != "", len(drivers))
	}
	var missing []string
	for _, p := range h.ports {
		for _, po := range providerOf {
			if strings.HasPrefix(p.dev, po.prefix) {
				if m, _ := filepath.Glob(h.env.p(provDir, "lib"+po.provider+"-rdmav*.so")); len(m) == 0 {
					missing = append(missing, fmt.Sprintf("%s needs lib%s-rdmav*.so", p.dev, po.provider))
				}
				break
			}
		}
	}
	if len(missing) > 0 {
		return res(c, Fail, install+" (or the vendor's OFED)", "no provider for a device in /%s: %s", provDir, strings.Join(dedup(missing), "; "))
	}
	return res(c, Pass, "", "%s, providers in /%s, %d drivers in /etc/libibverbs.d", lib, provDir, len(drivers))
}

func dedup(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
