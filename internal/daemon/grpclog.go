package daemon

import (
	"fmt"
	"strings"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/grpclog"
)

// InstallGRPCLogger routes grpc-go's own log (connection errors such as a
// peer sending bytes that are not HTTP/2) into the daemon's logger. gRPC's
// chatty info lines go to trace. Process-wide: call it once, from main.
func InstallGRPCLogger(l hclog.Logger) {
	grpclog.SetLoggerV2(grpcLogger{l.Named("grpc")})
}

type grpcLogger struct{ l hclog.Logger }

func (g grpcLogger) Info(args ...any)                    { g.l.Trace(fmt.Sprint(args...)) }
func (g grpcLogger) Infoln(args ...any)                  { g.l.Trace(fmt.Sprint(args...)) }
func (g grpcLogger) Infof(format string, args ...any)    { g.l.Trace(fmt.Sprintf(format, args...)) }
func (g grpcLogger) Warning(args ...any)                 { g.warn(fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any)               { g.warn(fmt.Sprint(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) { g.warn(fmt.Sprintf(format, args...)) }

// dialFailed marks gRPC's warning for each failed dial of a channel. The
// peer manager logs a peer's change of state once (internal/peer) and
// the batch gets the error; gRPC's line, once per dial and retry, goes to
// debug.
const dialFailed = "addrConn.createTransport failed to connect"

func (g grpcLogger) warn(msg string) {
	if strings.Contains(msg, dialFailed) {
		g.l.Debug(msg)
		return
	}
	g.l.Warn(msg)
}
func (g grpcLogger) Error(args ...any)                 { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any)               { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Errorf(format string, args ...any) { g.l.Error(fmt.Sprintf(format, args...)) }

// Fatal is only called by gRPC for unrecoverable misuse; it must not exit
// the daemon from library code, so it logs at error level.
func (g grpcLogger) Fatal(args ...any)                 { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Fatalln(args ...any)               { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Fatalf(format string, args ...any) { g.l.Error(fmt.Sprintf(format, args...)) }
func (g grpcLogger) V(level int) bool                  { return level <= 0 || g.l.IsTrace() }
