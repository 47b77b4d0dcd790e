package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
)

// warm makes the pair ready for each op (WarmTransfer), as an engine does
// when it learns of a peer's region, unless --cold; a daemon without
// WarmTransfer is noted and the run goes on cold.
func (r *runner) warm(ctx context.Context, eps *endpoints, regions *regionPair) error {
	if r.cfg.Cold {
		r.printf("warm-up    skipped (--cold): each size's first batch shows a cold pair\n")
		return nil
	}
	r.bar.set("warming the pair up")
	ops := r.cfg.Ops
	if len(ops) == 0 {
		ops = []string{OpWrite}
	}
	start := time.Now()
	var kind string
	for _, op := range ops {
		wctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		resp, err := eps.src.Warm(wctx, client.Transfer{SrcRegion: regions.src.ID(), Peer: eps.dstPeer, DstRegion: regions.dstExport,
			Transport: transportKind(r.cfg.Transport), Op: opKind(op)})
		cancel()
		if status.Code(err) == codes.Unimplemented {
			r.printf("warm-up    n/a: the daemon has no WarmTransfer; first batches are cold\n")
			return nil
		}
		if err != nil {
			return fmt.Errorf("warm-up (%s): %w", op, err)
		}
		kind = resp.GetTransportName()
	}
	secs := time.Since(start).Seconds()
	r.report.WarmSeconds = &secs
	r.printf("warm-up    %s ready in %s (WarmTransfer, %s; --cold skips it)\n", kind, fmt.Sprintf("%.1f ms", secs*1e3), strings.Join(ops, ", "))
	return nil
}
