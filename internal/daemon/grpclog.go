package daemon

import (
	"fmt"

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
func (g grpcLogger) Warning(args ...any)                 { g.l.Warn(fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any)               { g.l.Warn(fmt.Sprint(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) { g.l.Warn(fmt.Sprintf(format, args...)) }
func (g grpcLogger) Error(args ...any)                   { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any)                 { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Errorf(format string, args ...any)   { g.l.Error(fmt.Sprintf(format, args...)) }

// Fatal is only called by gRPC for unrecoverable misuse; it must not exit
// the daemon from library code, so it logs at error level.
func (g grpcLogger) Fatal(args ...any)                 { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Fatalln(args ...any)               { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Fatalf(format string, args ...any) { g.l.Error(fmt.Sprintf(format, args...)) }
func (g grpcLogger) V(level int) bool                  { return level <= 0 || g.l.IsTrace() }
