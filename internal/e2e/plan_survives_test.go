package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestPreparedSurvivesCut: prepared plans, push and pull, outlive the loss
// of their data connection to a peer that did not restart, over tcp and
// the same-host path. A submit cut by a 1 ms deadline, one cancelled
// mid-transfer, and submits whose deadline passes while the peer is
// stopped (SIGSTOP: the re-bind's handshake times out too, and the daemon
// forgets the peer) each leave the plan usable: the next submit, with no
// deadline, re-binds it and lands every block (CRC32C on both daemons). A
// real restart (kill -9, then the daemon again on its ports, the
// destination registered again under its name) makes the next submit fail
// with FailedPrecondition naming the restart.
func TestPreparedSurvivesCut(t *testing.T) {
	if testing.Short() {
		t.Skip("starts daemon processes")
	}
	bin := buildDaemon(t)
	// Large enough that a 1 ms deadline or a cancel lands mid-transfer.
	const n, size = 64, 1 << 20
	offs := strided(n, size)
	for _, tk := range []struct{ name, flag string }{{"tcp", "tcp"}, {"local", "auto"}} {
		t.Run(tk.name, func(t *testing.T) {
			a, b := startFrozenProc(t, bin, "a", tk.flag), startFrozenProc(t, bin, "b", tk.flag)
			ca, cb := dialSock(t, a.sock), dialSock(t, b.sock)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			kind := b2bv1.TransportKind_TRANSPORT_KIND_TCP
			if tk.name == "local" {
				kind = b2bv1.TransportKind_TRANSPORT_KIND_LOCAL
			}
			local, err := ca.RegisterHost(ctx, n*size, "")
			if err != nil {
				t.Fatal(err)
			}
			remote, err := cb.RegisterHost(ctx, n*size, "far", client.Readers("*"))
			if err != nil {
				t.Fatal(err)
			}
			// The pull first, alone: a pull's plan holds no prepared work
			// on the connection, so nothing keeps the daemon from
			// forgetting the peer when a handshake fails.
			ops := []struct {
				name string
				op   b2bv1.TransferOp
				p    *client.Plan
			}{{name: "pull", op: opRead}, {name: "push", op: b2bv1.TransferOp_TRANSFER_OP_WRITE}}
			round := 0
			for i := range ops {
				op := &ops[i]
				op.p, err = ca.Prepare(ctx, client.Transfer{SrcRegion: local.Id, Peer: b.peer, DstRegion: "far", Transport: kind, Op: op.op,
					Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: size}})
				if err != nil {
					t.Fatalf("prepare %s: %v", op.name, err)
				}
				p := op.p
				// Where the batch's bytes come from and land, and through
				// which daemon each is checked.
				src, dst, cs, cd := local, remote, ca, cb
				if op.op == opRead {
					src, dst, cs, cd = remote, local, cb, ca
				}
				// good submits with no deadline of the caller's (the
				// daemon's default applies) a fresh pattern and checks
				// every block.
				good := func(after string) {
					t.Helper()
					round++
					fill(src.Bytes, func(j int) byte { return byte(j>>12) + byte(round)*7 | 1 })
					if _, err := p.Submit(context.Background()); err != nil {
						t.Fatalf("%s: submit after %s: %v", op.name, after, err)
					}
					sameBlocks(ctx, t, cs, cd, src, dst, offs, offs, size)
				}
				good("prepare")

				// A 1 ms deadline, twice: the second finds the conn cut by
				// the first and re-binds under its own 1 ms.
				for i := 0; i < 2; i++ {
					dctx, dcancel := context.WithTimeout(ctx, time.Millisecond)
					_, err := p.Submit(dctx)
					dcancel()
					if err != nil && status.Code(err) != codes.DeadlineExceeded {
						t.Fatalf("%s: submit with a 1 ms deadline: %v", op.name, err)
					}
				}
				good("a 1 ms deadline")

				// A cancel once bytes are landing.
				clear(dst.Bytes)
				cctx, ccancel := context.WithCancel(ctx)
				errc := make(chan error, 1)
				go func() { _, err := p.Submit(cctx); errc <- err }()
				for cut := false; !cut; {
					select {
					case err := <-errc:
						if err != nil && status.Code(err) != codes.Canceled {
							t.Fatalf("%s: cancelled submit: %v", op.name, err)
						}
						cut = true
					case <-time.After(100 * time.Microsecond):
						if anyLanded(dst.Bytes, offs, size) {
							ccancel()
						}
					}
				}
				ccancel()
				good("a cancel mid-transfer")

				// The peer stopped: a submit's deadline cuts the conn, and
				// the next submit's re-bind cannot even handshake before
				// its own.
				if err := stopProc(b); err != nil {
					t.Fatal(err)
				}
				for i := 0; i < 2; i++ {
					round++
					fill(src.Bytes, func(j int) byte { return byte(j>>12) + byte(round)*7 | 1 })
					clear(dst.Bytes)
					dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
					_, err := p.Submit(dctx)
					dcancel()
					if err == nil && tk.name == "local" {
						// The same-host path copies between the mappings with
						// no help from the peer's daemon: a plan still bound
						// (the cancel above lost its race) lands every block
						// while the peer is stopped.
						if k := badBlock(src.Bytes, dst.Bytes, offs, offs, size); k >= 0 {
							_ = b.cmd.Process.Signal(syscall.SIGCONT)
							t.Fatalf("%s: submit %d to the stopped peer succeeded, but block %d differs", op.name, i, k)
						}
						t.Logf("%s: submit %d landed every block with the peer stopped (a bound same-host plan needs no peer)", op.name, i)
						continue
					}
					if err == nil || status.Code(err) == codes.FailedPrecondition {
						_ = b.cmd.Process.Signal(syscall.SIGCONT)
						t.Fatalf("%s: submit %d to the stopped peer: %v", op.name, i, err)
					}
				}
				if err := b.cmd.Process.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
				good("the peer was stopped and resumed")
			}

			// A real restart: same ports, the destination under its name.
			if err := b.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = b.cmd.Wait()
			remote.Unmap()
			b.start(t)
			cb2 := dialSock(t, b.sock)
			again, err := cb2.RegisterHost(ctx, n*size, "far", client.Readers("*"))
			if err != nil {
				t.Fatal(err)
			}
			defer again.Unmap()
			for _, op := range ops {
				_, err = op.p.Submit(ctx)
				if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "is stale: its peer "+b.peer+" restarted") {
					t.Fatalf("%s: submit after the peer restarted: %v", op.name, err)
				}
			}
		})
	}
}
