package verbs

import (
	"context"
	"os"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/transporttest"
)

// TestHWConformance runs the transport contract's suite between two verbs
// transports on one device, connected through fakePeer (no gRPC). Like
// the other hardware tests it needs B2B_RDMA_DEV (the Soft-RoCE testbed
// VMs set it: make test-rdma); elsewhere it skips.
func TestHWConformance(t *testing.T) {
	dev := hwDevice(t)
	log := hclog.New(&hclog.LoggerOptions{Name: "verbs", Level: hclog.Warn, Output: os.Stderr})
	transporttest.Run(t, transporttest.Factory{
		Kind: transport.Verbs,
		Caps: &Caps, // the driver (internal/transport/verbs/rails) declares it for one device
		// The remote NIC refuses a bad rkey with one status (IBV_WC_REM_ACCESS_ERR) whatever the receiver
		// would have said; the QPs are then in error and the batch layer retries on a fresh connection
		// after resolving again, so the caller sees the receiver's own answer.
		Gaps:   map[string]string{transporttest.GapRefusedAsAborted: "verbs: a remote access error is all the sender learns of a refused key"},
		Memory: mmapHost,
		New: func(t testing.TB, send, recv transport.Inbound) *transporttest.Pair {
			a, err := New(testConfig(dev), send, log.Named("a"))
			if err != nil {
				t.Fatal(err)
			}
			b, err := New(testConfig(dev), recv, log.Named("b"))
			if err != nil {
				a.Close()
				t.Fatal(err)
			}
			return &transporttest.Pair{Sender: a, Receiver: b, Connect: func(ctx context.Context) (transport.Conn, error) {
				return a.Connect(ctx, transport.Peer{Address: "loopback", Signal: b.HandleSignal})
			}}
		},
	})
}
