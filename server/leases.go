package server

import (
	"context"
	"sync"

	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/region"
)

// Regions are leased to the client that registered them (unless it asked
// them to persist): when the client is gone, the registry releases them
// (region.Registry.Expire). A client is a process on the Unix socket (its
// SO_PEERCRED pid: all its connections, so one that closes while another
// is open does not take the process's regions with it), else a single
// connection (TCP callers, whose process the kernel cannot tell). The
// connections are the ones the stats handler already tracks for prepared
// plans: a client is gone when its last one closes, whether it closed the
// client, exited or was killed.

// client is one lease holder.
type client struct {
	id    uint64 // region.Lease.Client; never 0
	pid   int32  // 0: a TCP caller, one connection
	conns int    // guarded by clients.mu
}

type clients struct {
	mu    sync.Mutex
	next  uint64
	byPID map[int32]*client
}

// join counts a new connection of ctx's caller and returns its client.
func (cs *clients) join(ctx context.Context) *client {
	var pid int32
	if l, ok := auth.Caller(ctx); ok {
		pid = l.PID
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c := cs.byPID[pid]; pid > 0 && c != nil {
		c.conns++
		return c
	}
	cs.next++
	c := &client{id: cs.next, pid: pid, conns: 1}
	if pid > 0 {
		if cs.byPID == nil {
			cs.byPID = map[int32]*client{}
		}
		cs.byPID[pid] = c
	}
	return c
}

// leave counts a closed connection of c; true when it was c's last.
func (cs *clients) leave(c *client) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c.conns--; c.conns > 0 {
		return false
	}
	if cs.byPID[c.pid] == c {
		delete(cs.byPID, c.pid)
	}
	return true
}

// leave ends c's leases when its last connection closed.
func (s *Server) leave(c *client) {
	if c == nil || !s.clients.leave(c) {
		return
	}
	// Its transfers first: a running one holds its source region.
	if n := s.batches.Transfers().ReleaseClient(c.id); n > 0 {
		s.cfg.Log.Info("client gone; its transfers are cancelled and their ids freed", "pid", c.pid, "transfers", n)
	}
	// Then its layouts: their holds would keep the client's regions mapped.
	if n, err := s.batches.Layouts().Expire(c.id); n > 0 || err != nil {
		s.cfg.Log.Info("client gone; its leased layouts are deregistered", "pid", c.pid, "layouts", n, "error", err)
	}
	if now, later := s.cfg.Registry.Expire(c.id); now+later > 0 {
		s.cfg.Log.Info("client gone; its leased regions are released", "pid", c.pid, "released", now, "after_their_batches", later)
	}
}

// lease is the lease a region registered on this call's connection gets:
// none when it is to persist, or when the connection is not tracked (no
// stats handler), which also persists.
func lease(ctx context.Context, persist bool) region.Lease {
	var l region.Lease
	if who, ok := auth.Caller(ctx); ok {
		l.PID = who.PID
	}
	if c, ok := ctx.Value(connKey{}).(*connCtx); ok && !persist && c.client != nil {
		l.Client = c.client.id
	}
	return l
}
