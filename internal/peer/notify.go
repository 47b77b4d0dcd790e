package peer

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/notify"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Notify hands n to the peer at addr (Peer.Notify), for its watchers.
func (m *Manager) Notify(ctx context.Context, addr string, n notify.Notification) error {
	st, err := m.kept.acquire(addr, false)
	if st == nil {
		if err == nil {
			err = fmt.Errorf("%w: peer %s is not connected", errs.ErrUnavailable, addr)
		}
		return err
	}
	defer st.done()
	if err := st.mu.LockContext(ctx); err != nil {
		return peerBusy(addr, err)
	}
	ctl := st.client
	st.mu.Unlock()
	if ctl == nil {
		return fmt.Errorf("%w: peer %s is not connected", errs.ErrUnavailable, addr)
	}
	req := &b2bv1.NotifyRequest{Region: n.Region, Sender: n.Sender, Notification: n.Notification, Blocks: n.Blocks, Bytes: n.Bytes}
	// The peer's note stream; a note the stream could not send (it had
	// broken) goes on a fresh one, once; a peer without streams, and a
	// stream that cannot open, get the call.
	for attempt := 0; attempt < 2; attempt++ {
		ns, err := st.noteStreamFor(ctl)
		if err != nil {
			break
		}
		_, sent, answered, err := ns.notify(ctx, req)
		if err == nil {
			return nil
		}
		if status.Code(err) == codes.Unimplemented { // an older b2bd: it never saw the note
			st.noNoteStreamOn(ctl)
			break
		}
		if sent || ctx.Err() != nil {
			return unconfirmed(sent && !answered, fromRPC(ctx, err))
		}
	}
	req.Seq = 0
	_, err = ctl.Notify(ctx, req)
	// A call cut by the caller's deadline or cancel may have reached the
	// peer; one the peer answered (a refusal) did not deliver the note.
	// The deadline also runs on the peer's side (gRPC sends it along), and
	// may end the call there a moment before ctx ends here: that is no
	// answer either.
	c := status.Code(err)
	cut := err != nil && (c == codes.DeadlineExceeded || (c == codes.Canceled && ctx.Err() != nil))
	return unconfirmed(cut, fromRPC(ctx, err))
}

// unconfirmed marks err, a note's failure, as notify.ErrUnconfirmed when
// the note left and no answer came (left): the peer may still deliver it
// (a frozen daemon does when continued), so it must not be reported as not
// delivered. The class stays err's.
func unconfirmed(left bool, err error) error {
	if !left || err == nil {
		return err
	}
	return fmt.Errorf("%w (%w)", err, notify.ErrUnconfirmed)
}
