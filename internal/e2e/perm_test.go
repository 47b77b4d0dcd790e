package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/b2bd/b2bd/client"
)

// TestNonRootClient: a client that is not root, only a member of the
// daemon's --group (numeric, 4242, no /etc/group entry), registers a host
// region, maps and writes it, sends it to a second daemon, checksums it and
// deregisters it. The daemon runs with umask 077: the shm directory must
// still be drwxrws--- of gid 4242 and the socket srw-rw---- of gid 4242.
func TestNonRootClient(t *testing.T) {
	needRoot(t)
	const group = 4242
	bin := buildDaemon(t)
	helper := helperBin(t)
	base := filepath.Join(sharedDir(t), "a") // created by the daemon, under umask 077
	a := &proc{bin: "/bin/sh", name: "a", sock: filepath.Join(base, "run", "b2bd.sock"), shm: filepath.Join(base, "shm"), peer: freePort(t), data: freePort(t)}
	a.args = []string{"-c", `umask 077; exec "$0" "$@"`, bin, "--node-name", a.name, "--socket", a.sock, "--shm-dir", a.shm,
		"--peer-listen", a.peer, "--data-listen", a.data, "--transport", "tcp", "--insecure", "--group", strconv.Itoa(group)}
	a.start(t)
	b := startProc(t, bin, "b")

	for _, c := range []struct {
		path string
		mode os.FileMode
	}{
		{a.shm, os.ModeDir | os.ModeSetgid | 0o770},
		{a.sock, os.ModeSocket | 0o660},
	} {
		st, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		gid := st.Sys().(*syscall.Stat_t).Gid
		if st.Mode() != c.mode || gid != group {
			t.Fatalf("%s: %v gid %d, want %v gid %d (daemon under umask 077)", c.path, st.Mode(), gid, c.mode, group)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cb, err := client.Dial(b.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	const size = 1 << 20
	dst, err := cb.RegisterHost(ctx, size, "from-nobody")
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Unmap()

	out := runAs(t, helper, []uint32{group}, "client", "B2B_SOCK="+a.sock, "B2B_PEER="+b.peer, "B2B_DST=from-nobody", "B2B_SIZE="+strconv.Itoa(size))
	t.Logf("helper:\n%s", out)
	var digest uint64
	if i := strings.Index(out, "DIGEST "); i < 0 {
		t.Fatalf("no digest from the helper")
	} else if _, err := fmt.Sscanf(out[i:], "DIGEST %x", &digest); err != nil {
		t.Fatal(err)
	}
	got, err := cb.Checksum(ctx, dst.Id, []uint64{0}, nil, size, 0, false)
	if err != nil || got.GetDigest() != digest {
		t.Fatalf("destination digest %x (%v), the client's %x", got.GetDigest(), err, digest)
	}
	for i, v := range dst.Bytes {
		if v != byte(i*31+7) {
			t.Fatalf("destination byte %d is %d", i, v)
		}
	}
	left, _ := os.ReadDir(a.shm)
	for _, e := range left {
		if !strings.HasPrefix(e.Name(), ".b2bd-") { // the daemon's instance lock
			t.Fatalf("files left in the shm dir after deregistration: %v", left)
		}
	}
}
