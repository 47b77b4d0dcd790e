package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// The lease client: a process of its own (this test binary run again) that
// registers a leased region and a persistent one on the daemon at
// $B2BD_LEASE_SOCK, prints their IDs and waits to be killed.
const leaseSockEnv = "B2BD_LEASE_SOCK"

func TestLeaseClientProcess(t *testing.T) {
	sock := os.Getenv(leaseSockEnv)
	if sock == "" {
		t.Skip("the lease client of TestRegionDiesWithItsClient")
	}
	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	leased, err := c.RegisterHost(ctx, 1<<20, "kv-cache")
	if err != nil {
		t.Fatal(err)
	}
	kept, err := c.RegisterHost(ctx, 1<<20, "weights", client.Persist())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("regions %s %s\n", leased.Id, kept.Id)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until killed
}

// regionsOf lists n's regions by ID.
func regionsOf(ctx context.Context, t *testing.T, c *client.Client) map[string]*b2bv1.Region {
	t.Helper()
	rs, err := c.Regions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*b2bv1.Region{}
	for _, r := range rs {
		m[r.GetId()] = r
	}
	return m
}

// waitGone polls until region id is no longer listed (the daemon sees the
// client's connection close asynchronously), or ctx ends.
func waitGone(ctx context.Context, t *testing.T, c *client.Client, id string) {
	t.Helper()
	for regionsOf(ctx, t, c)[id] != nil {
		select {
		case <-ctx.Done():
			t.Fatalf("region %s still registered after its client left: %v", id, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestRegionDiesWithItsClient: a client process that registers and is
// killed -9 takes its leased region with it (the name is free again, the
// shared memory removed); the region it registered with persist stays.
// While it lives, the listing shows each region's owner, process, age and
// persistence, and a name collision names the holder.
func TestRegionDiesWithItsClient(t *testing.T) {
	n := startNode(t, "a")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLeaseClientProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), leaseSockEnv+"="+strings.TrimPrefix(n.d.APIAddr(), "unix://"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	var leasedID, keptID string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "regions %s %s", &leasedID, &keptID); err == nil {
			break
		}
	}
	if leasedID == "" {
		t.Fatalf("the lease client printed no regions: %v", sc.Err())
	}
	rs := regionsOf(ctx, t, n.c)
	leased, kept := rs[leasedID], rs[keptID]
	pid := int32(cmd.Process.Pid)
	uid := fmt.Sprintf("uid %d", os.Getuid())
	if leased == nil || kept == nil {
		t.Fatalf("listing %v lacks %s or %s", rs, leasedID, keptID)
	}
	for _, r := range []*b2bv1.Region{leased, kept} {
		if r.GetPid() != pid || r.GetOwner() != uid || r.GetAgeNs() == 0 {
			t.Errorf("region %s: pid %d owner %q age %d ns; want pid %d, owner %q, an age", r.GetId(), r.GetPid(), r.GetOwner(), r.GetAgeNs(), pid, uid)
		}
	}
	if leased.GetPersist() || !kept.GetPersist() {
		t.Errorf("persist: leased %v, kept %v", leased.GetPersist(), kept.GetPersist())
	}
	st, err := n.c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetPersistentRegions() != 1 || st.GetLeaseHolders() != 1 {
		t.Errorf("Status: %d persistent regions, %d lease holders; want 1 and 1", st.GetPersistentRegions(), st.GetLeaseHolders())
	}
	// The rerun's collision names the holder.
	_, err = n.c.RegisterHost(ctx, 4096, "kv-cache")
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.AlreadyExists {
		t.Fatalf("register a taken name: %v, want AlreadyExists", err)
	}
	for _, w := range []string{"region " + leasedID, uid, fmt.Sprintf("pid %d", pid), "ago", "leased"} {
		if !strings.Contains(msg, w) {
			t.Errorf("the collision does not name the holder (%q): %s", w, msg)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed = true
	_ = cmd.Wait()
	waitGone(ctx, t, n.c, leasedID)
	// Unlisted first, then released: the file goes right after.
	for {
		_, err := os.Stat(leased.GetShmPath())
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the killed client's region file %s: %v, want it removed", leased.GetShmPath(), err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if r := regionsOf(ctx, t, n.c)[keptID]; r == nil || !r.GetPersist() {
		t.Fatalf("the persistent region %s went with its client: %v", keptID, r)
	}
	again, err := n.c.RegisterHost(ctx, 4096, "kv-cache")
	if err != nil {
		t.Fatalf("the rerun cannot take the name of the killed client's region: %v", err)
	}
	release(ctx, t, n.c, again)
}

// TestRegionLeaseEndsWithConnection: over the TCP API, where the kernel
// cannot tell the process, the lease is the connection's: closing the
// client releases its leased region, and not another connection's.
func TestRegionLeaseEndsWithConnection(t *testing.T) {
	n := startNode(t, "a", func(c *daemon.Config) { c.APIListen = "127.0.0.1:0" })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := client.Dial(n.d.APITCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	second := dialSock(t, n.d.APITCPAddr())
	gone, err := first.RegisterHost(ctx, 4096, "conn-lease")
	if err != nil {
		t.Fatal(err)
	}
	stays, err := second.RegisterHost(ctx, 4096, "other-conn")
	if err != nil {
		t.Fatal(err)
	}
	gone.Unmap()
	first.Close()
	waitGone(ctx, t, second, gone.Id)
	if regionsOf(ctx, t, second)[stays.Id] == nil {
		t.Fatalf("another connection's region %s went too", stays.Id)
	}
	if _, err := second.RegisterHost(ctx, 4096, "conn-lease"); err != nil {
		t.Fatalf("name of a closed connection's region: %v", err)
	}
}

// TestLayoutDiesWithItsClient: a layout is leased like its regions. When
// its client's connection closes, the layout goes (its name is free, its
// export resolves no more) and its hold no longer keeps the regions'
// memory: their files are removed. A persistent layout stays.
func TestLayoutDiesWithItsClient(t *testing.T) {
	n := startNode(t, "a", func(c *daemon.Config) { c.APIListen = "127.0.0.1:0" })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := client.Dial(n.d.APITCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	second := dialSock(t, n.d.APITCPAddr())
	reg := func(c *client.Client, name string, persist bool) *client.HostRegion {
		t.Helper()
		r, err := c.RegisterHost(ctx, 4096, "")
		if err != nil {
			t.Fatal(err)
		}
		l := client.Layout{Name: name, NumBlocks: 4, Export: name + "-x", Persist: persist,
			Segments: []client.Segment{{RegionID: r.Id, BlockLen: 1024, Stride: 1024}}}
		if _, err := c.RegisterLayout(ctx, l); err != nil {
			t.Fatal(err)
		}
		return r
	}
	gone := reg(first, "leased", false)
	kept := reg(first, "kept", true)
	path := gone.ShmPath
	gone.Unmap()
	first.Close()
	for {
		_, err := os.Stat(path)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("region file %s of a gone client's layout is still there: %v", path, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	ls, err := second.ListLayouts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, l := range ls {
		names[l.GetName()] = true
	}
	if names["leased"] || !names["kept"] {
		t.Fatalf("layouts after the client left: %v; want kept only", names)
	}
	_ = kept
	r2, err := second.RegisterHost(ctx, 4096, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := second.RegisterLayout(ctx, client.Layout{Name: "leased", NumBlocks: 4, Export: "leased-x",
		Segments: []client.Segment{{RegionID: r2.Id, BlockLen: 1024, Stride: 1024}}}); err != nil {
		t.Fatalf("the gone client's layout name and export: %v", err)
	}
}
