package e2e

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
)

// TestNotification: the destination's watcher hears of each batch only after
// all of its bytes are in place, with the sender's payload and counts.
func TestNotification(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n, size = 1000, 4096
	src, dst := registerPair(ctx, t, a.c, b.c, n*size, n*size, "kv")
	w, err := b.c.Watch(ctx, dst.Id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Header(); err != nil { // the stream is open once headers arrive
		t.Fatal(err)
	}
	offs := reversed(n, size)
	for round := byte(1); round <= 3; round++ {
		fill(src.Bytes, func(i int) byte { return round + byte(i) })
		_, err := a.c.BatchTransfer(ctx, client.Transfer{SrcRegion: src.Id, Peer: b.d.PeerAddr(), DstRegion: "kv",
			Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: size}, Notification: []byte{'r', round}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Notification, []byte{'r', round}) || got.Blocks != n || got.Bytes != n*size || got.Sender != "a" || got.Region != "kv" {
			t.Fatalf("round %d: notification %v", round, got)
		}
		if !bytes.Equal(src.Bytes, dst.Bytes) {
			t.Fatalf("round %d: notified before the data landed", round)
		}
	}
}

// TestWatchUnexportedRefused: peers notify a region by its export name, so a
// watch on an unexported region could never hear anything. The daemon says
// so at once (FailedPrecondition naming the region) instead of a silent wait.
func TestWatchUnexportedRefused(t *testing.T) {
	b := startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := b.c.RegisterHost(ctx, 4096, "")
	if err != nil {
		t.Fatal(err)
	}
	w, err := b.c.Watch(ctx, r.Id)
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), r.Id) || !strings.Contains(err.Error(), "not exported") {
		t.Fatalf("watch of unexported %s: %v, want FailedPrecondition naming it and 'not exported'", r.Id, err)
	}
}

// TestPullNotifiesTheOwner: a pull that asks for a notification
// tells the serving side once every READ completed, so the owner knows it
// may reuse the blocks: its watcher hears of the pull after the caller's
// region holds every block, with the puller's payload and counts.
func TestPullNotifiesTheOwner(t *testing.T) {
	for _, k := range pullKinds {
		t.Run(k.name, func(t *testing.T) {
			a, b := startNode(t, "a", k.cfg), startNode(t, "b", k.cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			const n, size = 500, 4096
			local, err := a.c.RegisterHost(ctx, n*size, "")
			if err != nil {
				t.Fatal(err)
			}
			remote, err := b.c.RegisterHost(ctx, n*size, "kv", client.Readers("*"))
			if err != nil {
				t.Fatal(err)
			}
			w, err := b.c.Watch(ctx, remote.Id)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Header(); err != nil {
				t.Fatal(err)
			}
			offs := reversed(n, size)
			for round := byte(1); round <= 3; round++ {
				fill(remote.Bytes, func(i int) byte { return round*7 + byte(i) })
				_, err := a.c.BatchTransfer(ctx, client.Transfer{SrcRegion: local.Id, Peer: b.d.PeerAddr(), DstRegion: "kv", Transport: k.kind, Op: opRead,
					Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: size}, Notification: []byte{'p', round}})
				if err != nil {
					t.Fatal(err)
				}
				got, err := w.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got.Notification, []byte{'p', round}) || got.Blocks != n || got.Bytes != n*size || got.Sender != "a" || got.Region != "kv" {
					t.Fatalf("round %d: notification %v", round, got)
				}
				if !bytes.Equal(local.Bytes, remote.Bytes) {
					t.Fatalf("round %d: the owner was notified, but the caller's region does not hold the blocks", round)
				}
			}
		})
	}
}

// TestWatchEndsWhenRegionGoes: a watch whose region is deregistered, or
// whose export is cleared, can never hear another note: the stream ends,
// NotFound or FailedPrecondition naming the region, after the notes that
// came before. (It used to stay open until the client cancelled it.)
func TestWatchEndsWhenRegionGoes(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(ctx context.Context, c *client.Client, id string) error
		code codes.Code
	}{
		{"deregistered", func(ctx context.Context, c *client.Client, id string) error { return c.Deregister(ctx, id) }, codes.NotFound},
		{"unexported", func(ctx context.Context, c *client.Client, id string) error { return c.Export(ctx, id, "") }, codes.FailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := startNode(t, "b")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r, err := b.c.RegisterHost(ctx, 4096, "watched")
			if err != nil {
				t.Fatal(err)
			}
			w, err := b.c.Watch(ctx, r.Id)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Header(); err != nil {
				t.Fatal(err)
			}
			if n, err := b.c.NotifyRegion(ctx, r.Id, []byte("last")); err != nil || n != 1 {
				t.Fatalf("NotifyRegion: %d watchers, %v", n, err)
			}
			if err := tc.end(ctx, b.c, r.Id); err != nil {
				t.Fatal(err)
			}
			got, err := w.Recv()
			if err != nil || string(got.Notification) != "last" {
				t.Fatalf("the note before the end: %v, %v", got, err)
			}
			_, err = w.Recv()
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), r.Id) {
				t.Fatalf("watch after the region was %s: %v, want %v naming %s", tc.name, err, tc.code, r.Id)
			}
		})
	}
}
