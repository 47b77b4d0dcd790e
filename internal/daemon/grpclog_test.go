package daemon

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// TestGRPCDialWarningsDemoted: gRPC's warning for every failed dial (49 of
// them on one daemon redialling dead peers) is debug; other warnings stay.
func TestGRPCDialWarningsDemoted(t *testing.T) {
	var out bytes.Buffer
	g := grpcLogger{hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Warn})}
	for range 3 {
		g.Warningf("[core] [Channel #1 SubChannel #2]grpc: addrConn.createTransport failed to connect to {Addr: %q}. Err: connection refused", "127.0.0.2:1")
	}
	if out.Len() != 0 {
		t.Fatalf("dial failures logged at warn:\n%s", out.String())
	}
	g.Warning("server: bad preface")
	if !strings.Contains(out.String(), "[WARN]") || !strings.Contains(out.String(), "bad preface") {
		t.Fatalf("another warning was not logged at warn: %q", out.String())
	}
}
