package verbs

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/Mellanox/rdmamap"
)

// SysfsRoot is where the kernel exposes RDMA devices; tests point it at a
// fake tree.
const SysfsRoot = "/sys/class/infiniband"

// GIDEntry is one populated slot of a port's GID table, as sysfs shows it.
type GIDEntry struct {
	Index  int
	GID    GID
	Type   string // "RoCE v2", "IB/RoCE v1"
	NetDev string // the netdev the GID belongs to (RoCE)
}

// RoCEv2 reports a RoCE v2 (UDP-encapsulated, routable) GID.
func (e GIDEntry) RoCEv2() bool { return strings.EqualFold(strings.TrimSpace(e.Type), "RoCE v2") }

// ReadGIDTable reads the populated GID slots of dev/port under root
// (SysfsRoot in production). Empty (all-zero) slots are skipped.
func ReadGIDTable(root, dev string, port int) ([]GIDEntry, error) {
	pdir := filepath.Join(root, dev, "ports", strconv.Itoa(port))
	names, err := os.ReadDir(filepath.Join(pdir, "gids"))
	if err != nil {
		return nil, fmt.Errorf("verbs: read GID table of %s port %d: %w", dev, port, err)
	}
	var out []GIDEntry
	for _, n := range names {
		idx, err := strconv.Atoi(n.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(pdir, "gids", n.Name()))
		if err != nil {
			continue // unreadable slots are empty on some kernels
		}
		g, ok := ParseGID(strings.TrimSpace(string(raw)))
		if !ok || g.IsZero() {
			continue
		}
		e := GIDEntry{Index: idx, GID: g}
		if b, err := os.ReadFile(filepath.Join(pdir, "gid_attrs", "types", n.Name())); err == nil {
			e.Type = strings.TrimSpace(string(b))
		}
		if b, err := os.ReadFile(filepath.Join(pdir, "gid_attrs", "ndevs", n.Name())); err == nil {
			e.NetDev = strings.TrimSpace(string(b))
		}
		out = append(out, e)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Index < out[b].Index })
	return out, nil
}

// ParseGID parses sysfs's "fe80:0000:...:0001" form (or any IPv6 text).
func ParseGID(s string) (GID, bool) {
	var g GID
	if len(s) == 39 && strings.Count(s, ":") == 7 {
		hex := strings.ReplaceAll(s, ":", "")
		for k := 0; k < 16; k++ {
			v, err := strconv.ParseUint(hex[2*k:2*k+2], 16, 8)
			if err != nil {
				return g, false
			}
			g[k] = byte(v)
		}
		return g, true
	}
	ip := net.ParseIP(s)
	if ip == nil {
		return g, false
	}
	copy(g[:], ip.To16())
	return g, true
}

// PortNetDevs lists the netdevs that own GIDs of dev/port.
func PortNetDevs(root, dev string, port int) []string {
	tab, err := ReadGIDTable(root, dev, port)
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, e := range tab {
		if e.NetDev != "" && !seen[e.NetDev] {
			seen[e.NetDev] = true
			out = append(out, e.NetDev)
		}
	}
	return out
}

// DeviceForNetDev names the RDMA device bound to a netdev (via rdmamap).
func DeviceForNetDev(netdev string) (string, error) {
	d, err := rdmamap.GetRdmaDeviceForNetdevice(netdev)
	if err != nil || d == "" {
		if err == nil {
			err = errors.New("no RDMA device")
		}
		return "", fmt.Errorf("verbs: RDMA device for netdev %s: %w (%w)", netdev, err, ErrUnavailable)
	}
	return d, nil
}

// SysfsDevices lists RDMA devices the kernel knows (via rdmamap).
func SysfsDevices() []string { return rdmamap.GetRdmaDeviceList() }

// GIDChoice is the GID a transport uses and why.
type GIDChoice struct {
	Index  int
	GID    GID
	Type   string
	NetDev string
	Reason string
}

// AddrsFunc lists a netdev's IP addresses (net.InterfaceByName in
// production; injectable for tests).
type AddrsFunc func(netdev string) ([]net.IP, error)

// NetDevAddrs is the production AddrsFunc.
func NetDevAddrs(netdev string) ([]net.IP, error) {
	ifc, err := net.InterfaceByName(netdev)
	if err != nil {
		return nil, err
	}
	as, err := ifc.Addrs()
	if err != nil {
		return nil, err
	}
	var ips []net.IP
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			ips = append(ips, n.IP)
		}
	}
	return ips, nil
}

// SelectGID picks the source GID of a port.
//
// InfiniBand: index 0 (the port GID; addressing is by LID) unless want ≥ 0.
// RoCE: only RoCE v2 GIDs qualify (v1 is not routable and mixing versions
// between peers breaks RTR); among those whose netdev is netdev (any netdev
// when empty), prefer the IPv4-mapped GID of an address the netdev really
// has, then a global IPv6 address it has, then link-local. want ≥ 0 forces
// an index, which must exist.
func SelectGID(table []GIDEntry, ll LinkLayer, netdev string, want int, addrs AddrsFunc) (GIDChoice, error) {
	if want >= 0 {
		for _, e := range table {
			if e.Index == want {
				if ll == LinkEthernet && netdev != "" && e.NetDev != "" && e.NetDev != netdev {
					return GIDChoice{}, fmt.Errorf("verbs: GID index %d belongs to netdev %s, not %s: %w", want, e.NetDev, netdev, ErrInvalidArgument)
				}
				return GIDChoice{Index: e.Index, GID: e.GID, Type: e.Type, NetDev: e.NetDev, Reason: "configured"}, nil
			}
		}
		return GIDChoice{}, fmt.Errorf("verbs: GID index %d is empty or absent (populated: %s): %w", want, describeTable(table), ErrInvalidArgument)
	}
	if ll == LinkInfiniBand {
		for _, e := range table {
			if e.Index == 0 {
				return GIDChoice{Index: 0, GID: e.GID, Type: e.Type, Reason: "InfiniBand port GID (LID-routed)"}, nil
			}
		}
		return GIDChoice{}, fmt.Errorf("verbs: InfiniBand port has no GID 0: %w", ErrUnavailable)
	}
	best, bestRank := -1, 0
	reasons := [...]string{"", "link-local RoCE v2 GID", "RoCE v2 GID of a global IPv6 address on %s", "RoCE v2 GID of IPv4 address %s on %s"}
	var reason string
	for k, e := range table {
		if !e.RoCEv2() || (netdev != "" && e.NetDev != netdev) {
			continue
		}
		ip := net.IP(e.GID[:])
		rank := 0
		var ips []net.IP
		if addrs != nil && e.NetDev != "" {
			ips, _ = addrs(e.NetDev)
		}
		has := func() bool {
			for _, a := range ips {
				if a.Equal(ip) {
					return true
				}
			}
			return false
		}
		switch {
		case ip.To4() != nil && has():
			rank = 3
		case ip.To4() == nil && !ip.IsLinkLocalUnicast() && has():
			rank = 2
		case ip.IsLinkLocalUnicast():
			rank = 1
		}
		if rank > bestRank {
			best, bestRank = k, rank
			switch rank {
			case 3:
				reason = fmt.Sprintf(reasons[3], ip.To4(), e.NetDev)
			case 2:
				reason = fmt.Sprintf(reasons[2], e.NetDev)
			default:
				reason = reasons[1]
			}
		}
	}
	if best < 0 {
		where := "any netdev"
		if netdev != "" {
			where = "netdev " + netdev
		}
		return GIDChoice{}, fmt.Errorf("verbs: no usable RoCE v2 GID for %s (populated: %s); give the netdev an IP address or pass --gid-index: %w",
			where, describeTable(table), ErrUnavailable)
	}
	e := table[best]
	return GIDChoice{Index: e.Index, GID: e.GID, Type: e.Type, NetDev: e.NetDev, Reason: reason}, nil
}

func describeTable(t []GIDEntry) string {
	if len(t) == 0 {
		return "none"
	}
	var b strings.Builder
	for k, e := range t {
		if k > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "[%d] %s %s %s", e.Index, e.GID, e.Type, e.NetDev)
	}
	return b.String()
}
