package region

// Leases: which clients hold region leases, and ending them when a client
// is gone.
//
// Regions are leased to the client that registered them (unless it asked
// them to persist): when the client is gone, its regions are released. A
// client is a process on the Unix socket (its SO_PEERCRED pid: all its
// connections, so one that closes while another is open does not take the
// process's regions with it), else a single connection (TCP callers, whose
// process the kernel cannot tell). The server joins each connection to its
// client and leaves it when the connection closes, whether the client
// closed it, exited or was killed: the client is gone with its last one.

import "sync"

// Client is one lease holder.
type Client struct {
	ID    uint64 // Lease.Client of its regions; never 0
	PID   int32  // 0: a TCP caller, one connection
	conns int    // guarded by Leases.mu
}

// Lease is the lease of a region that process pid (0: unknown) registers
// on a connection of c: held by c, or none when the region is to persist
// or the connection is not tracked (c nil), which also persists.
func (c *Client) Lease(pid int32, persist bool) Lease {
	l := Lease{PID: pid}
	if c != nil && !persist {
		l.Client = c.ID
	}
	return l
}

// Leases tracks the registry's lease holders and ends the leases of those
// gone. One per registry: it numbers the clients the regions name.
type Leases struct {
	g     *Registry
	mu    sync.Mutex
	next  uint64
	byPID map[int32]*Client
}

// Leases is the registry's lease holders.
func (g *Registry) Leases() *Leases { return g.leases }

// Join counts a new connection of process pid (0: unknown, a connection
// of its own) and returns its client.
func (l *Leases) Join(pid int32) *Client {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.byPID[pid]; pid > 0 && c != nil {
		c.conns++
		return c
	}
	l.next++
	c := &Client{ID: l.next, PID: pid, conns: 1}
	if pid > 0 {
		if l.byPID == nil {
			l.byPID = map[int32]*Client{}
		}
		l.byPID[pid] = c
	}
	return c
}

// Leave counts a closed connection of c. When it was c's last, c is gone:
// first ends what else of c's holds its regions (its transfers and
// layouts, which would keep them mapped), then c's leased regions are
// released (Expire). It reports whether c is gone.
func (l *Leases) Leave(c *Client, first func(*Client)) bool {
	if c == nil || !l.leave(c) {
		return false
	}
	if first != nil {
		first(c)
	}
	if now, later := l.Expire(c.ID); now+later > 0 {
		l.g.cfg.Log.Info("client gone; its leased regions are released", "pid", c.PID, "released", now, "after_their_batches", later)
	}
	return true
}

// leave counts a closed connection of c; true when it was c's last.
func (l *Leases) leave(c *Client) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.conns--; c.conns > 0 {
		return false
	}
	if l.byPID[c.PID] == c {
		delete(l.byPID, c.PID)
	}
	return true
}

// Expire ends the leases of client (its last connection closed): its
// regions are unpublished now (their names free, their keys refused) and
// released, at once if no batch or plan uses them, else when the last one
// lets go. It returns how many were released now and how many later.
func (l *Leases) Expire(client uint64) (now, later int) {
	if client == 0 {
		return 0, 0
	}
	g := l.g
	var free []*Region
	g.mu.Lock()
	for _, r := range g.byID {
		if r.client != client || r.Persist {
			continue
		}
		g.unpublish(r)
		if r.active == 0 {
			free = append(free, r)
			continue
		}
		r.drain = true
		g.draining[r] = struct{}{}
		later++
	}
	g.mu.Unlock()
	for _, r := range free {
		g.cfg.Log.Info("client gone; its region is released", "id", r.ID, "owner", r.Owner.String(), "pid", r.PID, "export", r.Export)
		g.close(r)
	}
	return len(free), later
}

// Counts counts the regions that persist and the distinct clients holding
// the others' leases.
func (l *Leases) Counts() (persistent, holders int) {
	g := l.g
	g.mu.Lock()
	defer g.mu.Unlock()
	seen := map[uint64]struct{}{}
	for _, r := range g.byID {
		if r.Persist {
			persistent++
		} else {
			seen[r.client] = struct{}{}
		}
	}
	return persistent, len(seen)
}
