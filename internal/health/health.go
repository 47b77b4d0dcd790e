// Package health serves grpc.health.v1 for b2bd: SERVING while the daemon
// serves, NOT_SERVING from the moment it starts draining (SIGTERM), before
// its in-flight batches finish. The same status is served on the local API
// and peer listeners and, for Kubernetes probes that cannot do TLS, on an
// optional plaintext health-only listener (gRPC and HTTP /healthz).
package health

import (
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Services named in health checks besides the overall "" status.
var Services = []string{"b2b.v1.B2B", "b2b.v1.Peer"}

// Health is the daemon's serving status.
type Health struct {
	srv      *health.Server
	draining atomic.Bool
}

// New reports SERVING for "" and every name in Services.
func New() *Health {
	h := &Health{srv: health.NewServer()}
	h.srv.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	for _, s := range Services {
		h.srv.SetServingStatus(s, healthpb.HealthCheckResponse_SERVING)
	}
	return h
}

// Register adds grpc.health.v1 to s.
func (h *Health) Register(s grpc.ServiceRegistrar) { healthpb.RegisterHealthServer(s, h.srv) }

// Drain turns every status to NOT_SERVING for good (watchers are told at
// once). It is idempotent.
func (h *Health) Drain() {
	if h.draining.Swap(true) {
		return
	}
	h.srv.Shutdown()
}

// Draining reports whether Drain was called.
func (h *Health) Draining() bool { return h.draining.Load() }

// Handler serves the health-only port: grpc.health.v1 to gRPC requests
// (HTTP/2, plaintext with prior knowledge, as Kubernetes' gRPC probes
// speak it) and GET /healthz to anything else. Serve it with an
// http.Server whose Protocols allow unencrypted HTTP/2 (see NewHTTPServer).
func (h *Health) Handler() http.Handler {
	g := grpc.NewServer()
	h.Register(g)
	mux := http.NewServeMux()
	mux.Handle("/healthz", h.HTTPHandler())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			g.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// NewHTTPServer is the health-only port's server: HTTP/1.1 and plaintext
// HTTP/2.
func (h *Health) NewHTTPServer() *http.Server {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{Handler: h.Handler(), Protocols: &p, ReadHeaderTimeout: 10 * time.Second}
}

// HTTPHandler answers 200 "SERVING" while serving and 503 "NOT_SERVING"
// while draining.
func (h *Health) HTTPHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if h.Draining() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("NOT_SERVING\n"))
			return
		}
		_, _ = w.Write([]byte("SERVING\n"))
	})
}
