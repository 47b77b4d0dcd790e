package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
)

// TestCrashReclaim: the region files of a daemon killed with kill -9 are
// freed by the next daemon on the same shm directory, which logs what it
// freed; a live daemon sharing the directory keeps its files, and a
// client's import file is untouched. Imports may not use the daemon's
// reserved names.
func TestCrashReclaim(t *testing.T) {
	bin := buildDaemon(t)
	shm := filepath.Join(t.TempDir(), "shm")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A live daemon with a region and a client's import.
	live := startProcIn(t, bin, "live", shm)
	cl := dialSock(t, live.sock)
	kept, err := cl.RegisterHost(ctx, 1<<20, "")
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Unmap()
	copy(kept.Bytes, "still here")
	importPath := filepath.Join(shm, "client-import.bin")
	mine := bytes.Repeat([]byte("client data "), 4096/12+1)[:4096]
	if err := os.WriteFile(importPath, mine, 0o600); err != nil {
		t.Fatal(err)
	}
	imported, err := cl.ImportHostFile(ctx, importPath, 0, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	defer imported.Unmap()

	// Reserved names cannot be imported, directly or through a link.
	for _, name := range []string{"b2bd-0123456789abcdef-region-x", ".b2bd-0123456789abcdef.lock"} {
		p := filepath.Join(shm, name)
		if err := os.WriteFile(p, mine, 0o600); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(shm, "innocent-"+strings.TrimPrefix(name, "."))
		if err := os.Symlink(p, link); err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{p, link} {
			_, err := cl.ImportHostFile(ctx, path, 0, 0, "")
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "host_file.path") || !strings.Contains(err.Error(), "reserved") {
				t.Fatalf("import of %s: %v, want InvalidArgument naming host_file.path and the reserved prefix", path, err)
			}
		}
		os.Remove(p)
		os.Remove(link)
	}

	// A daemon with a region is killed.
	dead := startProcIn(t, bin, "dead", shm)
	cd := dialSock(t, dead.sock)
	const lost = 8 << 20
	gone, err := cd.RegisterHost(ctx, lost, "")
	if err != nil {
		t.Fatal(err)
	}
	gone.Unmap()
	locks, _ := filepath.Glob(filepath.Join(shm, ".b2bd-*.lock"))
	if len(locks) != 2 {
		t.Fatalf("instance locks %v, want one per daemon", locks)
	}
	_ = dead.cmd.Process.Kill()
	_ = dead.cmd.Wait()
	if _, err := os.Stat(gone.ShmPath); err != nil {
		t.Fatalf("the killed daemon's region file should still be there before the restart: %v", err)
	}

	// Lock files a client could plant are never taken for a dead daemon's:
	// one owned by another uid, and a FIFO (opening it must not hang).
	planted := filepath.Join(shm, "b2bd-aaaaaaaaaaaaaaaa-region-x")
	for _, p := range []string{planted, filepath.Join(shm, ".b2bd-aaaaaaaaaaaaaaaa.lock")} {
		if err := os.WriteFile(p, mine, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, nobody, nobody); err != nil && os.Geteuid() == 0 {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(shm, ".b2bd-bbbbbbbbbbbbbbbb.lock"), 0o600); err != nil {
		t.Fatal(err)
	}

	// The next daemon on the directory reclaims it, and only it.
	next := startProcIn(t, bin, "next", shm)
	if _, err := os.Stat(gone.ShmPath); !os.IsNotExist(err) {
		t.Fatalf("the killed daemon's region file %s survived the next daemon's start: %v\n%s", gone.ShmPath, err, next.stderr)
	}
	// The daemon logged before it listened, but its stderr reaches us
	// through a pipe and a copying goroutine: wait for the line.
	log := next.stderr.String()
	for wait := time.Now().Add(30 * time.Second); !strings.Contains(log, "reclaimed the files of a dead daemon instance"); log = next.stderr.String() {
		if time.Now().After(wait) {
			t.Fatalf("no log line of what was freed:\n%s", log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(log, "files=1") || !strings.Contains(log, "bytes=8388608") {
		t.Fatalf("the log line does not say what was freed (1 file, 8388608 bytes):\n%s", log)
	}
	t.Logf("next daemon:\n%s", log)
	for _, p := range []string{kept.ShmPath, importPath, planted} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("a live daemon's file or a client's import was touched: %v", err)
		}
	}
	if got, err := os.ReadFile(importPath); err != nil || !bytes.Equal(got, mine) {
		t.Fatalf("the client's import changed: %v", err)
	}
	locks, _ = filepath.Glob(filepath.Join(shm, ".b2bd-*.lock"))
	if len(locks) != 4 {
		t.Fatalf("lock files after the reclaim %v, want the live daemon's, the next one's and the two planted", locks)
	}
	// The live daemon still serves its regions.
	for _, r := range []*client.HostRegion{kept, imported} {
		if _, err := cl.Checksum(ctx, r.Id, []uint64{0}, nil, 4096, 0, false); err != nil {
			t.Fatalf("the live daemon's region %s after the reclaim: %v", r.Id, err)
		}
	}
	if strings.Contains(live.stderr.String(), "reclaimed") {
		t.Fatalf("the live daemon reclaimed something:\n%s", live.stderr)
	}
}
