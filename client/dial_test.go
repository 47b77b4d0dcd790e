package client

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestDialSocketPaths: a socket path relative to the working directory is
// a path (a target without a colon cannot be host:port), as an absolute
// one and a unix: URL are; an empty target is refused naming what to give.
func TestDialSocketPaths(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "a", "b2bd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	b2bv1.RegisterB2BServer(gs, &manyDaemon{}) // Ping: the embedded Unimplemented answers it
	go gs.Serve(ln)
	defer gs.Stop()
	t.Chdir(dir)
	for _, target := range []string{sock, "unix://" + sock, "a/b2bd.sock", "./a/b2bd.sock", "../" + filepath.Base(dir) + "/a/b2bd.sock"} {
		c, err := Dial(target)
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = c.Ping(ctx)
		cancel()
		c.Close()
		// The fake does not implement Ping: Unimplemented means the call reached it.
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("%s: %v; want the daemon reached (Unimplemented from the fake)", target, err)
		}
	}
	if _, err := Dial(""); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty target: %v, want InvalidArgument", err)
	}
}
