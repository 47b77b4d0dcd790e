package server

import (
	"context"

	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/region"
)

// Regions are leased to the client that registered them; the registry
// tracks the clients (region.Leases). The server only tells it of each
// connection, through the stats handler that already tracks them for
// prepared plans, and ends the batch layer's hold on a gone client's
// regions before they go.

// join counts a new connection of ctx's caller and returns its client.
func (s *Server) join(ctx context.Context) *region.Client {
	var pid int32
	if who, ok := auth.Caller(ctx); ok {
		pid = who.PID
		if pid <= 0 && s.unknownPID.CompareAndSwap(false, true) {
			s.cfg.Log.Warn("a client's process ID is not visible to this daemon (it runs in a PID namespace of its own): each of that process's connections holds its regions apart, and a region goes when the connection that registered it closes; run the daemon in the host's PID namespace (Kubernetes: hostPID: true)", "uid", who.UID)
		}
	}
	return s.cfg.Registry.Leases().Join(pid)
}

// leave counts a closed connection of c; with its last, c's leases end.
func (s *Server) leave(c *region.Client) {
	s.cfg.Registry.Leases().Leave(c, s.releaseClient)
}

// releaseClient ends gone client c's transfers and layouts, before its
// regions go: a running transfer holds its source region, and a layout's
// holds would keep the client's regions mapped.
func (s *Server) releaseClient(c *region.Client) {
	if n := s.batches.Transfers().ReleaseClient(c.ID); n > 0 {
		s.cfg.Log.Info("client gone; its transfers are cancelled and their ids freed", "pid", c.PID, "transfers", n)
	}
	if n, err := s.batches.Layouts().Expire(c.ID); n > 0 || err != nil {
		s.cfg.Log.Info("client gone; its leased layouts are deregistered", "pid", c.PID, "layouts", n, "error", err)
	}
}

// lease is the lease a region registered on this call's connection gets
// (region.Client.Lease).
func lease(ctx context.Context, persist bool) region.Lease {
	var pid int32
	if who, ok := auth.Caller(ctx); ok {
		pid = who.PID
	}
	var c *region.Client
	if cc, ok := ctx.Value(connKey{}).(*connCtx); ok {
		c = cc.client
	}
	return c.Lease(pid, persist)
}
