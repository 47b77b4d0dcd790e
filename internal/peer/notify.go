package peer

import (
	"context"
	"fmt"

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
	_, err = ctl.Notify(ctx, &b2bv1.NotifyRequest{Region: n.Region, Sender: n.Sender,
		Notification: n.Notification, Blocks: n.Blocks, Bytes: n.Bytes})
	return fromRPC(ctx, err)
}
