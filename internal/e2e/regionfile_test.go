package e2e

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestRegionFileTruncated: a client that truncates its region's file (before
// or during a Checksum) gets DataLoss naming the region; the daemon survives
// and keeps serving another region's checksum and a transfer.
func TestRegionFileTruncated(t *testing.T) {
	a, b, ca, cb := startProcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alive := func(what string) {
		t.Helper()
		if _, err := ca.Status(ctx); err != nil {
			t.Fatalf("%s: the daemon is gone: %v\n%s", what, err, a.stderr)
		}
	}

	const size = 16 << 20
	// truncated registers a region, truncates its file to one page, and
	// returns its ID; the test's own mapping goes first (it would fault too).
	truncated := func() string {
		r, err := ca.RegisterHost(ctx, size, "")
		if err != nil {
			t.Fatal(err)
		}
		path := r.ShmPath
		if err := r.Unmap(); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, 4096); err != nil {
			t.Fatal(err)
		}
		return r.Id
	}
	many := strided(4096, 4096) // 16 MiB in 4 KiB blocks: hashed by several workers
	for _, tc := range []struct {
		name   string
		offs   []uint64
		blockL uint64
	}{
		{"one block past the end", []uint64{size - 4096}, 4096},
		{"whole region in one block", []uint64{0}, size},
		{"many blocks over parallel workers", many, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := truncated()
			for _, alg := range []b2bv1.ChecksumAlgorithm{b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_XXH64} {
				_, err := ca.Checksum(ctx, id, tc.offs, nil, tc.blockL, alg, false)
				alive(tc.name)
				if status.Code(err) != codes.DataLoss || !strings.Contains(status.Convert(err).Message(), "region "+id) {
					t.Fatalf("%v: Checksum of truncated region %s = %v, want DataLoss naming the region", alg, id, err)
				}
				t.Logf("%v", err)
			}
			if err := ca.Deregister(ctx, id); err != nil {
				t.Fatalf("deregister the truncated region: %v", err)
			}
		})
	}

	t.Run("during a checksum", func(t *testing.T) {
		r, err := ca.RegisterHost(ctx, size, "")
		if err != nil {
			t.Fatal(err)
		}
		path := r.ShmPath
		r.Unmap()
		errc := make(chan error, 1)
		go func() {
			var err error
			for range 20 {
				if _, err = ca.Checksum(ctx, r.Id, many, nil, 4096, 0, false); err != nil {
					break
				}
			}
			errc <- err
		}()
		if err := os.Truncate(path, 4096); err != nil {
			t.Fatal(err)
		}
		err = <-errc
		alive("truncated during a checksum")
		// The truncation may land before, during or after each call; once it
		// has landed every later call fails.
		if err == nil {
			_, err = ca.Checksum(ctx, r.Id, many, nil, 4096, 0, false)
		}
		if status.Code(err) != codes.DataLoss {
			t.Fatalf("Checksum after a truncation during checksums = %v, want DataLoss", err)
		}
		_ = ca.Deregister(ctx, r.Id)
	})

	// Others keep being served: a checksum and a verified transfer.
	src, dst := registerPair(ctx, t, ca, cb, 1<<20, 1<<20, "dst")
	defer src.Unmap()
	defer dst.Unmap()
	fill(src.Bytes, func(i int) byte { return byte(i*13 + 1) })
	sa, err := ca.Checksum(ctx, src.Id, []uint64{0}, nil, 1<<20, 0, false)
	if err != nil {
		t.Fatalf("checksum of a healthy region after the faults: %v", err)
	}
	if _, err := transfer(ctx, ca, src.Id, b.peer, "dst", []uint64{0}, []uint64{0}, 1<<20); err != nil {
		t.Fatalf("transfer after the faults: %v", err)
	}
	sb, err := cb.Checksum(ctx, dst.Id, []uint64{0}, nil, 1<<20, 0, false)
	if err != nil || sb.GetDigest() != sa.GetDigest() || !bytes.Equal(src.Bytes, dst.Bytes) {
		t.Fatalf("transfer after the faults: digests %x/%x (%v)", sa.GetDigest(), sb.GetDigest(), err)
	}
}

// TestRegionFileReplaced: a client that unlinks its region's file and puts a
// new one at the same path does not change what the daemon hashes (it keeps
// its mapping of the old inode), and deregistration leaves the new file alone.
func TestRegionFileReplaced(t *testing.T) {
	bin := buildDaemon(t)
	a := startProc(t, bin, "a")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ca := dialSock(t, a.sock)
	const size = 1 << 20
	r, err := ca.RegisterHost(ctx, size, "")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Unmap()
	fill(r.Bytes, func(i int) byte { return byte(i * 7) })
	before, err := ca.Checksum(ctx, r.Id, []uint64{0}, nil, size, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(r.ShmPath); err != nil {
		t.Fatal(err)
	}
	mine := bytes.Repeat([]byte("client's own file "), 1000)
	if err := os.WriteFile(r.ShmPath, mine, 0o600); err != nil {
		t.Fatal(err)
	}
	after, err := ca.Checksum(ctx, r.Id, []uint64{0}, nil, size, 0, false)
	if err != nil || after.GetDigest() != before.GetDigest() {
		t.Fatalf("checksum after the file was replaced: %x, %v; want %x from the daemon's mapping", after.GetDigest(), err, before.GetDigest())
	}
	if err := ca.Deregister(ctx, r.Id); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(r.ShmPath)
	if err != nil || !bytes.Equal(got, mine) {
		t.Fatalf("deregistration touched the client's new file at %s: %v", r.ShmPath, err)
	}
}
