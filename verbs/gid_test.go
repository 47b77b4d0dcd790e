package verbs

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// fakeSysfs writes a GID table the way the kernel lays it out.
func fakeSysfs(t *testing.T, dev string, port int, entries []GIDEntry, empty []int) string {
	t.Helper()
	root := t.TempDir()
	pdir := filepath.Join(root, dev, "ports", fmt.Sprint(port))
	for _, d := range []string{"gids", "gid_attrs/types", "gid_attrs/ndevs"} {
		if err := os.MkdirAll(filepath.Join(pdir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(rel, s string) {
		if err := os.WriteFile(filepath.Join(pdir, rel), []byte(s+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range entries {
		var s string
		for k := 0; k < 16; k += 2 {
			if k > 0 {
				s += ":"
			}
			s += fmt.Sprintf("%02x%02x", e.GID[k], e.GID[k+1])
		}
		write(filepath.Join("gids", fmt.Sprint(e.Index)), s)
		write(filepath.Join("gid_attrs/types", fmt.Sprint(e.Index)), e.Type)
		write(filepath.Join("gid_attrs/ndevs", fmt.Sprint(e.Index)), e.NetDev)
	}
	for _, i := range empty {
		write(filepath.Join("gids", fmt.Sprint(i)), "0000:0000:0000:0000:0000:0000:0000:0000")
	}
	return root
}

func gidOf(ip string) GID {
	var g GID
	copy(g[:], net.ParseIP(ip).To16())
	return g
}

func TestReadGIDTable(t *testing.T) {
	in := []GIDEntry{
		{Index: 0, GID: gidOf("fe80::5054:ff:fe77:1"), Type: "RoCE v2", NetDev: "eth0"},
		{Index: 1, GID: gidOf("::ffff:10.77.0.1"), Type: "RoCE v2", NetDev: "eth0"},
		{Index: 10, GID: gidOf("::ffff:10.77.0.1"), Type: "IB/RoCE v1", NetDev: "eth0"},
	}
	root := fakeSysfs(t, "rxe0", 1, in, []int{2, 3})
	got, err := ReadGIDTable(root, "rxe0", 1)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(in) {
		t.Fatalf("got %v\nwant %v", got, in)
	}
	if nd := PortNetDevs(root, "rxe0", 1); len(nd) != 1 || nd[0] != "eth0" {
		t.Fatalf("netdevs %v", nd)
	}
	if _, err := ReadGIDTable(root, "mlx5_9", 1); err == nil {
		t.Fatal("missing device read fine")
	}
}

func TestSelectGID(t *testing.T) {
	roce := []GIDEntry{
		{Index: 0, GID: gidOf("fe80::1"), Type: "IB/RoCE v1", NetDev: "eth0"},
		{Index: 1, GID: gidOf("fe80::1"), Type: "RoCE v2", NetDev: "eth0"},
		{Index: 2, GID: gidOf("::ffff:10.0.0.1"), Type: "IB/RoCE v1", NetDev: "eth0"},
		{Index: 3, GID: gidOf("::ffff:10.0.0.1"), Type: "RoCE v2", NetDev: "eth0"},
		{Index: 4, GID: gidOf("2001:db8::1"), Type: "RoCE v2", NetDev: "eth1"},
		{Index: 5, GID: gidOf("::ffff:192.168.9.9"), Type: "RoCE v2", NetDev: "eth1"}, // stale: not on eth1
	}
	addrs := func(nd string) ([]net.IP, error) {
		switch nd {
		case "eth0":
			return []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("fe80::1")}, nil
		case "eth1":
			return []net.IP{net.ParseIP("2001:db8::1")}, nil
		}
		return nil, errors.New("no such netdev")
	}
	tests := []struct {
		name    string
		table   []GIDEntry
		ll      LinkLayer
		netdev  string
		want    int
		wantIdx int
		err     error
	}{
		{"auto: RoCE v2 IPv4 GID", roce, LinkEthernet, "", -1, 3, nil},
		{"netdev eth1: global IPv6 beats a stale IPv4", roce, LinkEthernet, "eth1", -1, 4, nil},
		{"forced index", roce, LinkEthernet, "", 1, 1, nil},
		{"forced index of another netdev", roce, LinkEthernet, "eth0", 4, 0, errs.ErrInvalidArgument},
		{"forced empty index", roce, LinkEthernet, "", 9, 0, errs.ErrInvalidArgument},
		{"v1 only", roce[:1], LinkEthernet, "", -1, 0, errs.ErrUnavailable},
		{"unknown netdev", roce, LinkEthernet, "eth7", -1, 0, errs.ErrUnavailable},
		{"link-local only", roce[:2], LinkEthernet, "", -1, 1, nil},
		{"InfiniBand: GID 0", []GIDEntry{{Index: 0, GID: gidOf("fe80::2")}}, LinkInfiniBand, "", -1, 0, nil},
		{"InfiniBand without GID 0", nil, LinkInfiniBand, "", -1, 0, errs.ErrUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := SelectGID(tc.table, tc.ll, tc.netdev, tc.want, addrs)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("got %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || c.Index != tc.wantIdx {
				t.Fatalf("got %+v, %v; want index %d", c, err, tc.wantIdx)
			}
			if c.Reason == "" {
				t.Fatal("no reason given")
			}
		})
	}
}

func TestParseGID(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"fe80:0000:0000:0000:5054:00ff:fe77:0001", true},
		{"0000:0000:0000:0000:0000:ffff:0a4d:0001", true},
		{"::ffff:10.0.0.1", true},
		{"zz80:0000:0000:0000:5054:00ff:fe77:0001", false},
		{"", false},
	} {
		if _, ok := ParseGID(tc.in); ok != tc.ok {
			t.Fatalf("%q: ok=%v", tc.in, ok)
		}
	}
	g, _ := ParseGID("0000:0000:0000:0000:0000:ffff:0a4d:0001")
	if g.String() != "10.77.0.1" {
		t.Fatalf("%s", g)
	}
}

func TestMTU(t *testing.T) {
	for m := MTU256; m <= MTU4096; m++ {
		b := m.Bytes()
		if got, ok := MTUFromBytes(b); !ok || got != m {
			t.Fatalf("%d bytes -> %v", b, got)
		}
	}
	if _, ok := MTUFromBytes(1500); ok {
		t.Fatal("1500 accepted")
	}
}
