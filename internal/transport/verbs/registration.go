package verbs

import (
	"errors"
	"fmt"
	"sync"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	ibv "github.com/b2bd/b2bd/verbs"
)

// registration is memory registered with the PD. Its MR can be replaced
// (Rekey, when the region's export narrows): the old MR, whose rkey peers
// may still hold, is retired and deregistered once the batches using it
// drained, so a batch in flight on it is never cut, and new resolutions get
// the new key.
type registration struct {
	transport.SingleKey // RekeyFor (Rekey replaces every access set's MR), Rails
	t                   *Transport
	mem                 memory.Memory
	path                string // how the NIC reached the memory, for logs and tests

	mu  sync.Mutex
	cur *mrRef // the write MR (transport.AccessWrite): Key's
	// acc are the MRs of the other access sets, made when KeyFor first
	// asks (and again after a Rekey retired them): accRead remote READ
	// only, accReadWrite both.
	acc [accSets]*mrRef
	// rd is the local-write-only MR that READs land through (useRead),
	// made by the first read and never exported: a read cut by its caller
	// is fenced by deregistering it (fence), which the region's keys
	// survive.
	rd     *mrRef
	old    []*mrRef // retired by Rekey, still in use
	closed bool
	// withdrawn: Withdraw retired every MR and made none (the memory's
	// file was truncated): no key works, none is made, cur is retired.
	withdrawn bool
	err       error
}

// Indices of registration.acc.
const (
	accRead = iota
	accReadWrite
	accSets
)

// accessFlags are the ibv access flags of the MR for a: remote WRITE keys
// cannot READ and remote READ keys cannot WRITE, so each grant's rkey allows
// exactly what was granted. LOCAL_WRITE goes with REMOTE_WRITE (verbs
// requires it) and lets the write MR be a READ's local destination.
func accessFlags(a transport.Access) ibv.Access {
	switch a {
	case transport.AccessWrite:
		return ibv.AccessLocalWrite | ibv.AccessRemoteWrite
	case transport.AccessRead:
		return ibv.AccessRemoteRead
	}
	return ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead
}

// mrRef is one MR of a registration and the batches using it: sending
// batches post with its lkey, receiving ones land through its rkey (from
// the meta to the ack). Guarded by registration.mu.
type mrRef struct {
	mr      *ibv.MR
	users   int
	retired bool
	write   bool // allows remote WRITE: receiving batches may land through it
	fenced  bool // deregistered by fence while in use; its users only drop it
}

// KeyFor is the key of the registration's MR for access a: the write MR's
// (Key) for AccessWrite; for AccessRead (remote READ only) and for both, an
// MR of its own, registered on first use and kept until Rekey or Close.
func (r *registration) KeyFor(a transport.Access) (transport.RemoteKey, error) {
	var k int
	switch a {
	case transport.AccessWrite:
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.closed || r.withdrawn {
			return transport.RemoteKey{}, fmt.Errorf("verbs: key for write: registration %s: %w", r.state(), errs.ErrFailedPrecondition)
		}
		return mrKey(r.cur.mr), nil
	case transport.AccessRead:
		k = accRead
	case transport.AccessRead | transport.AccessWrite:
		k = accReadWrite
	default:
		return transport.RemoteKey{}, fmt.Errorf("verbs: key for access %#x (want write %#x, read %#x or both): %w",
			a, transport.AccessWrite, transport.AccessRead, errs.ErrInvalidArgument)
	}
	r.mu.Lock()
	if r.closed || r.withdrawn {
		st := r.state()
		r.mu.Unlock()
		return transport.RemoteKey{}, fmt.Errorf("verbs: key for access %#x: registration %s: %w", a, st, errs.ErrFailedPrecondition)
	}
	if m := r.acc[k]; m != nil {
		r.mu.Unlock()
		return mrKey(m.mr), nil
	}
	r.mu.Unlock()
	t := r.t
	mr, _, err := t.regMR(r.mem, accessFlags(a))
	if err != nil {
		return transport.RemoteKey{}, fmt.Errorf("verbs: register an MR for access %#x (%d bytes): %w", a, r.mem.Len, err)
	}
	t.live.mrs.Add(1)
	r.mu.Lock()
	if r.closed || r.withdrawn || r.acc[k] != nil { // closed or withdrawn, or another caller was first
		gone, st, m := r.closed || r.withdrawn, r.state(), r.acc[k]
		r.mu.Unlock()
		_ = mr.Close()
		t.live.mrs.Add(-1)
		if gone {
			return transport.RemoteKey{}, fmt.Errorf("verbs: key for access %#x: registration %s: %w", a, st, errs.ErrFailedPrecondition)
		}
		return mrKey(m.mr), nil
	}
	ref := &mrRef{mr: mr, write: a&transport.AccessWrite != 0}
	r.acc[k] = ref
	r.mu.Unlock()
	if ref.write {
		t.mu.Lock()
		t.byRKey[mr.RKey()] = r
		t.mu.Unlock()
	}
	return mrKey(mr), nil
}

func (r *registration) Memory() memory.Memory { return r.mem }

// Path names the registration mechanism: "ibv_reg_mr (host)",
// "ibv_reg_dmabuf_mr" or "ibv_reg_mr (nvidia-peermem)".
func (r *registration) Path() string { return r.path }

// Key is the current rkey and the address WRs target for offset 0.
func (r *registration) Key() transport.RemoteKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	return mrKey(r.cur.mr)
}

func mrKey(mr *ibv.MR) transport.RemoteKey {
	return transport.RemoteKey{Key: uint64(mr.RKey()), Addr: mr.Addr()}
}

// state names why a registration serves no more: closed or withdrawn
// (r.mu held).
func (r *registration) state() string {
	if r.withdrawn && !r.closed {
		return "withdrawn (its memory's file was truncated)"
	}
	return "closed"
}

// unusable is state under r.mu: why use returned nil.
func (r *registration) unusable() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state()
}

// use holds the current MR for a sending batch; nil once closed or
// withdrawn.
func (r *registration) use() *mrRef {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.withdrawn {
		return nil
	}
	r.cur.users++
	return r.cur
}

// useRKey holds the MR with rkey (current or retired but not yet
// deregistered) for a receiving batch; nil when there is none.
func (r *registration) useRKey(rkey uint32) *mrRef {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.withdrawn {
		return nil
	}
	if r.cur.mr.RKey() == rkey {
		r.cur.users++
		return r.cur
	}
	if m := r.acc[accReadWrite]; m != nil && m.mr.RKey() == rkey {
		m.users++
		return m
	}
	for _, m := range r.old {
		if m.write && m.mr.RKey() == rkey {
			m.users++
			return m
		}
	}
	return nil
}

// useRead holds the MR that READs land through, registering it on first
// use (with LOCAL_WRITE only: it is never a remote key).
func (r *registration) useRead() (*mrRef, error) {
	r.mu.Lock()
	if r.closed || r.withdrawn {
		r.mu.Unlock()
		return nil, fmt.Errorf("verbs: read: destination registration %s: %w", r.state(), errs.ErrFailedPrecondition)
	}
	if m := r.rd; m != nil {
		m.users++
		r.mu.Unlock()
		return m, nil
	}
	r.mu.Unlock()
	t := r.t
	mr, _, err := t.regMR(r.mem, ibv.AccessLocalWrite)
	if err != nil {
		return nil, fmt.Errorf("verbs: register the read destination MR (%d bytes): %w", r.mem.Len, err)
	}
	t.live.mrs.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.withdrawn || r.rd != nil {
		_ = mr.Close()
		t.live.mrs.Add(-1)
		if r.rd == nil || r.closed || r.withdrawn {
			return nil, fmt.Errorf("verbs: read: destination registration %s: %w", r.state(), errs.ErrFailedPrecondition)
		}
		r.rd.users++
		return r.rd, nil
	}
	r.rd = &mrRef{mr: mr, users: 1}
	return r.rd, nil
}

// fence deregisters m, the read MR of a read cut with READs in flight, at
// once, whoever still uses it: from its return no READ response lands
// through it (the NIC fails them with a local protection error). The next
// read registers a fresh one. It reports whether the deregistration
// succeeded.
func (r *registration) fence(m *mrRef) bool {
	r.mu.Lock()
	if m.fenced {
		r.mu.Unlock()
		return true
	}
	m.fenced, m.retired = true, true
	if r.rd == m {
		r.rd = nil
	}
	for k, o := range r.old {
		if o == m {
			r.old = append(r.old[:k], r.old[k+1:]...)
			break
		}
	}
	r.mu.Unlock()
	t := r.t
	if err := m.mr.Close(); err != nil {
		t.log.Warn("verbs: deregistering a cut read's MR failed", "bytes", r.mem.Len, "error", err)
		return false
	}
	t.live.mrs.Add(-1)
	// The next read's MR is registered now, in the background, not on that
	// read's path (registering pins every page: 0.1 s and more for a large
	// region in the emulated VMs), where its deadline could not cut it.
	t.bg.Add(1)
	go func() {
		defer t.bg.Done()
		if m, err := r.useRead(); err == nil {
			r.done(m)
		}
	}()
	return true
}

// done releases a use; a retired MR goes with its last user.
func (r *registration) done(m *mrRef) {
	r.mu.Lock()
	m.users--
	if m.fenced { // deregistered already
		r.mu.Unlock()
		return
	}
	var gone *mrRef
	if m.retired && m.users == 0 && !r.closed {
		for k, o := range r.old {
			if o == m {
				r.old = append(r.old[:k], r.old[k+1:]...)
				gone = m
				break
			}
		}
	}
	r.mu.Unlock()
	if gone != nil {
		r.t.retire(r, gone)
	}
}

// retire deregisters a retired MR: its rkey stops working at the NIC.
func (t *Transport) retire(r *registration, m *mrRef) {
	rkey := m.mr.RKey()
	t.mu.Lock()
	if t.byRKey[rkey] == r {
		delete(t.byRKey, rkey)
	}
	t.mu.Unlock()
	if err := m.mr.Close(); err != nil {
		t.log.Warn("verbs: deregistering a revoked MR failed", "rkey", rkey, "error", err)
	}
	t.live.mrs.Add(-1)
	t.log.Debug("verbs: revoked rkey deregistered", "rkey", rkey)
}

// Rekey registers the memory afresh (new MR: new rkey and lkey) and retires
// the old MR, which is deregistered at once when no batch uses it, else when
// the last one ends: from then on a WRITE with the old rkey fails at the NIC
// with a remote access error. The MRs of the other access sets (KeyFor) are
// retired the same way and made afresh, with new rkeys, when KeyFor next
// asks: a READ with an old read key fails at the NIC too (a READ in flight
// on it is cut: the peer's NIC holds no use of ours). It returns the old
// write key.
func (r *registration) Rekey() (transport.RemoteKey, error) {
	t := r.t
	mr, _, err := t.regMR(r.mem, accessFlags(transport.AccessWrite))
	if err != nil {
		return transport.RemoteKey{}, fmt.Errorf("verbs: re-register %d bytes to revoke the rkey: %w", r.mem.Len, err)
	}
	t.live.mrs.Add(1)
	r.mu.Lock()
	if r.closed || r.withdrawn {
		st := r.state()
		r.mu.Unlock()
		_ = mr.Close()
		t.live.mrs.Add(-1)
		return transport.RemoteKey{}, fmt.Errorf("verbs: rekey: registration %s: %w", st, errs.ErrFailedPrecondition)
	}
	old := r.cur
	r.cur = &mrRef{mr: mr, write: true}
	gone := r.retireAll(old)
	idle := old.users == 0
	r.mu.Unlock()
	t.mu.Lock()
	t.byRKey[mr.RKey()] = r
	t.mu.Unlock()
	key := mrKey(old.mr)
	for _, m := range gone {
		t.retire(r, m)
	}
	t.log.Debug("verbs: registration rekeyed", "old_rkey", key.Key, "new_rkey", mr.RKey(), "old_in_use", !idle)
	return key, nil
}

// retireAll retires cur (the write MR being replaced or withdrawn) and the
// access sets' MRs: those no batch uses are returned, to be deregistered
// (Transport.retire) once r.mu is released; the others go with their last
// user (done). r.mu held.
func (r *registration) retireAll(cur *mrRef) (gone []*mrRef) {
	for _, m := range []*mrRef{cur, r.acc[accRead], r.acc[accReadWrite], r.rd} {
		if m == nil {
			continue
		}
		m.retired = true
		if m.users == 0 {
			gone = append(gone, m)
		} else {
			r.old = append(r.old, m)
		}
	}
	r.acc, r.rd = [accSets]*mrRef{}, nil
	return gone
}

var _ transport.Registration = (*registration)(nil)

// Withdraw retires every MR of the registration, as Rekey retires the old
// ones, and registers none: from then on a READ or WRITE with any of its
// rkeys fails at the NIC (an MR a sending batch uses goes when it ends), no
// key is made, and no batch may use it. The memory's file was truncated:
// a new MR could not pin it, and the old one pins pages that are no longer
// the file's. Safe twice; Close still releases it.
func (r *registration) Withdraw() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("verbs: withdraw: registration closed: %w", errs.ErrFailedPrecondition)
	}
	if r.withdrawn {
		r.mu.Unlock()
		return nil
	}
	r.withdrawn = true
	gone := r.retireAll(r.cur)
	r.mu.Unlock()
	for _, m := range gone {
		r.t.retire(r, m)
	}
	r.t.log.Info("verbs: registration withdrawn: its rkeys no longer work", "rkey", r.cur.mr.RKey(), "bytes", r.mem.Len)
	return nil
}

// Close deregisters every MR of the registration; safe twice. Callers make
// sure no batch uses it (the registry refuses to deregister a region in use;
// the transport destroys its QP sets first).
func (r *registration) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return r.err
	}
	r.closed = true
	mrs := append([]*mrRef(nil), r.old...)
	if !r.withdrawn { // withdrawn: cur was retired (or is in old)
		mrs = append(mrs, r.cur)
	}
	for _, m := range r.acc {
		if m != nil {
			mrs = append(mrs, m)
		}
	}
	if r.rd != nil {
		mrs = append(mrs, r.rd)
	}
	r.old, r.acc, r.rd = nil, [accSets]*mrRef{}, nil
	r.mu.Unlock()
	t := r.t
	t.mu.Lock()
	delete(t.regs, r)
	for _, m := range mrs {
		if t.byRKey[m.mr.RKey()] == r {
			delete(t.byRKey, m.mr.RKey())
		}
	}
	t.mu.Unlock()
	var errList []error
	for _, m := range mrs {
		errList = append(errList, m.mr.Close())
		t.live.mrs.Add(-1)
	}
	err := errors.Join(errList...)
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
	return err
}

// useRKey finds the registration whose MR has rkey and holds that MR for a
// receiving batch; nil when no live MR has it.
func (t *Transport) useRKey(rkey uint32) (*registration, *mrRef) {
	t.mu.Lock()
	r := t.byRKey[rkey]
	t.mu.Unlock()
	if r == nil {
		return nil, nil
	}
	if m := r.useRKey(rkey); m != nil {
		return r, m
	}
	return nil, nil
}
