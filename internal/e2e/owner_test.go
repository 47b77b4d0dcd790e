package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/daemon"
	"github.com/b2bd/b2bd/internal/testca"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// nobody is the second uid of the ownership and permission tests.
const nobody = 65534

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test runs a client under a second uid")
	}
}

// sharedDir is a temporary directory every uid can traverse (t.TempDir is
// 0700), removed at the end of the test.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "b2bd-shared-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// helperBin copies this test binary where another uid can run it (go
// test's build directory is 0700).
func helperBin(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	bin := filepath.Join(sharedDir(t), "e2e-helper")
	out, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// runAs runs TestHelperProcess of bin as uid nobody with the supplementary
// groups, in the given mode, and returns its output; it fails the test if
// the helper fails.
func runAs(t *testing.T, bin string, groups []uint32, mode string, env ...string) string {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append([]string{"B2B_HELPER=" + mode, "PATH=/usr/bin:/bin"}, env...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: groups}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper %s as uid %d: %v\n%s", mode, nobody, err, out)
	}
	return string(out)
}

// TestHelperProcess is not a test: it is the second uid's client, run by
// runAs.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv("B2B_HELPER")
	if mode == "" {
		t.Skip("helper process for the ownership and permission tests")
	}
	if err := helperRun(mode); err != nil {
		fmt.Printf("HELPER FAILED (uid %d): %v\n", os.Getuid(), err)
		os.Exit(1)
	}
	fmt.Printf("HELPER OK (uid %d)\n", os.Getuid())
	os.Exit(0)
}

// helperRun dials B2B_SOCK and runs the helper mode on that client.
func helperRun(mode string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(os.Getenv("B2B_SOCK"))
	if err != nil {
		return err
	}
	defer c.Close()
	switch mode {
	case "intruder":
		return helperIntruder(ctx, c)
	case "client":
		return helperClient(ctx, c)
	}
	return fmt.Errorf("unknown helper mode %q", mode)
}

// helperIntruder acts on another uid's region B2B_REGION: every call must
// be refused with PermissionDenied naming the region, and ListRegions must
// not show it. It registers a region of its own (exported as
// B2B_OWN_EXPORT) and leaves it registered.
func helperIntruder(ctx context.Context, c *client.Client) error {
	victim := os.Getenv("B2B_REGION")
	denied := func(what string, err error) error {
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), victim) {
			return fmt.Errorf("%s of another uid's region %s: %v; want PermissionDenied naming the region", what, victim, err)
		}
		fmt.Printf("%s: %v\n", what, err)
		return nil
	}
	var errsSeen []error
	errsSeen = append(errsSeen,
		denied("DeregisterRegion", c.Deregister(ctx, victim)),
		denied("ExportRegion", c.Export(ctx, victim, "stolen")))
	_, err := c.Checksum(ctx, victim, []uint64{0}, nil, 4096, 0, false)
	errsSeen = append(errsSeen, denied("Checksum", err))
	_, err = transfer(ctx, c, victim, "127.0.0.1:1", "anywhere", []uint64{0}, []uint64{0}, 4096)
	errsSeen = append(errsSeen, denied("BatchTransfer from", err))
	w, err := c.Watch(ctx, victim)
	if err == nil {
		_, err = w.Recv()
	}
	errsSeen = append(errsSeen, denied("WatchNotifications", err))
	if err := errors.Join(errsSeen...); err != nil {
		return err
	}
	// Not mapped here: that is TestNonRootClient's business. It persists:
	// the test looks for it after this process exits.
	resp, err := c.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
		Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: 4096}}, ExportName: os.Getenv("B2B_OWN_EXPORT"), Persist: true})
	if err != nil {
		return fmt.Errorf("register its own region: %w", err)
	}
	own := resp.GetRegion()
	if _, err := c.Checksum(ctx, own.GetId(), []uint64{0}, nil, 4096, 0, false); err != nil {
		return fmt.Errorf("checksum of its own region: %w", err)
	}
	list, err := c.Regions(ctx)
	if err != nil {
		return err
	}
	for _, r := range list {
		if r.GetId() != own.GetId() {
			return fmt.Errorf("ListRegions shows region %s, not the caller's", r.GetId())
		}
	}
	if len(list) != 1 {
		return fmt.Errorf("ListRegions shows %d regions, want its own one", len(list))
	}
	return nil
}

// TestRegionOwnership: regions belong to the uid that registered them. A
// second uid's Deregister, Export, Checksum, BatchTransfer from and Watch
// on the first uid's region get PermissionDenied and its ListRegions does
// not show it; root sees and may act on every region.
func TestRegionOwnership(t *testing.T) {
	needRoot(t)
	bin := helperBin(t)
	dir := sharedDir(t)
	n := startNode(t, "a", func(c *daemon.Config) {
		c.Socket, c.SocketMode = filepath.Join(dir, "b2bd.sock"), "0666"
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	victim, err := n.c.RegisterHost(ctx, 1<<20, "victim")
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Unmap()
	before, err := n.c.Checksum(ctx, victim.Id, []uint64{0}, nil, 1<<20, 0, false)
	if err != nil {
		t.Fatal(err)
	}

	out := runAs(t, bin, nil, "intruder", "B2B_SOCK="+filepath.Join(dir, "b2bd.sock"), "B2B_REGION="+victim.Id, "B2B_OWN_EXPORT=nobodys")
	t.Logf("helper:\n%s", out)

	// Untouched: still registered, exported under its own name, same bytes.
	list, err := n.c.Regions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids, exports []string
	for _, r := range list {
		ids, exports = append(ids, r.GetId()), append(exports, r.GetExportName())
	}
	if len(list) != 2 || !slices.Contains(ids, victim.Id) || !slices.Contains(exports, "victim") || !slices.Contains(exports, "nobodys") {
		t.Fatalf("root's ListRegions = %v exports %v, want the victim and the other uid's region", ids, exports)
	}
	after, err := n.c.Checksum(ctx, victim.Id, []uint64{0}, nil, 1<<20, 0, false)
	if err != nil || after.GetDigest() != before.GetDigest() {
		t.Fatalf("victim after the intruder: %v", err)
	}
	// Root may act on the other uid's region.
	for _, r := range list {
		if err := n.c.Deregister(ctx, r.GetId()); err != nil {
			t.Fatalf("root deregisters %s: %v", r.GetId(), err)
		}
	}
}

// TestRegionOwnershipOverTLS: over the TCP API (mutual TLS, uid unknown) a
// region belongs to the caller's certificate identity; another identity is
// refused, and neither reaches a region registered on the socket.
func TestRegionOwnershipOverTLS(t *testing.T) {
	ca := testca.New(t, "ca")
	n := startNode(t, "api", withTLS(t, ca, "api"), func(c *daemon.Config) { c.APIListen = "0.0.0.0:0" })
	_, port, _ := net.SplitHostPort(n.d.APITCPAddr())
	dial := func(identity string) *client.Client {
		cert, key := ca.Issue(t, identity)
		tl, err := auth.LoadPeerTLS(cert, key, ca.PEM)
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.Dial(net.JoinHostPort("127.0.0.1", port), grpc.WithTransportCredentials(credentials.NewTLS(tl.Client)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	alice, mallory := dial("alice"), dial("mallory")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg := func(c *client.Client, name string) string {
		r, err := c.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
			Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: 4096}}, ExportName: name})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetRegion().GetId()
	}
	mine := reg(alice, "alices")
	sock := reg(n.c, "roots")
	for _, id := range []string{mine, sock} {
		if _, err := mallory.Checksum(ctx, id, []uint64{0}, nil, 4096, 0, false); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), id) {
			t.Fatalf("mallory checksums %s: %v, want PermissionDenied", id, err)
		}
		if err := mallory.Deregister(ctx, id); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("mallory deregisters %s: %v, want PermissionDenied", id, err)
		}
	}
	if _, err := alice.Checksum(ctx, sock, []uint64{0}, nil, 4096, 0, false); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("alice checksums root's socket region: %v, want PermissionDenied", err)
	}
	if l, err := mallory.Regions(ctx); err != nil || len(l) != 0 {
		t.Fatalf("mallory's ListRegions = %v, %v; want none", l, err)
	}
	if l, err := alice.Regions(ctx); err != nil || len(l) != 1 || l[0].GetId() != mine {
		t.Fatalf("alice's ListRegions = %v, %v; want %s only", l, err, mine)
	}
	if _, err := alice.Checksum(ctx, mine, []uint64{0}, nil, 4096, 0, false); err != nil {
		t.Fatalf("alice checksums her region: %v", err)
	}
	if err := alice.Deregister(ctx, mine); err != nil {
		t.Fatalf("alice deregisters her region: %v", err)
	}
}

// helperClient is a non-root application end to end: it registers a host
// region on B2B_SOCK, maps and fills it, sends it to B2B_PEER's export
// B2B_DST, checksums it and deregisters it; it prints the digest.
func helperClient(ctx context.Context, c *client.Client) error {
	size, err := strconv.ParseUint(os.Getenv("B2B_SIZE"), 10, 64)
	if err != nil {
		return err
	}
	r, err := c.RegisterHost(ctx, size, "")
	if err != nil {
		return fmt.Errorf("register and map a host region: %w", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(r.ShmPath, &st); err != nil {
		return err
	}
	if st.Mode&0o7777 != 0o660 || st.Uid != uint32(os.Getuid()) || st.Gid != uint32(os.Getgid()) {
		return fmt.Errorf("region file %s: mode %#o uid %d gid %d; want 0660 and the caller's uid and gid", r.ShmPath, st.Mode&0o7777, st.Uid, st.Gid)
	}
	fill(r.Bytes, func(i int) byte { return byte(i*31 + 7) })
	if _, err := transfer(ctx, c, r.Id, os.Getenv("B2B_PEER"), os.Getenv("B2B_DST"), []uint64{0}, []uint64{0}, size); err != nil {
		return fmt.Errorf("transfer: %w", err)
	}
	sum, err := c.Checksum(ctx, r.Id, []uint64{0}, nil, size, 0, false)
	if err != nil {
		return fmt.Errorf("checksum: %w", err)
	}
	fmt.Printf("DIGEST %x\n", sum.GetDigest())
	if err := r.Unmap(); err != nil {
		return err
	}
	if err := c.Deregister(ctx, r.Id); err != nil {
		return fmt.Errorf("deregister: %w", err)
	}
	return nil
}
