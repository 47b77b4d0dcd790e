package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/staging"
	"github.com/b2bd/b2bd/internal/transport"
)

// maxCached bounds the destinations a connection keeps mapped: room for
// two full sets (maxSetKeys), so that pushes and pulls over the same
// regions (a write key and a read key each, the KV bench's --op both over
// 160 layer tensors) alternate without evicting and mapping again (a
// populated 8 MiB mapping costs ~0.5 ms: 30-50 ms a request at 256).
const maxCached = 512

// remote is a peer's destination as this sender maps it.
type remote struct {
	kind uint32
	size uint64
	mm   []byte // host: the whole mmap (page-aligned), unmapped on eviction
	host []byte // host: the region's bytes
	base uintptr
	dptr uintptr // CUDA: the region's start in this process
	dev  int     // CUDA: the device the handle was opened on
	home int     // CUDA: the device that holds the memory; -1: not visible here
	pin  hostPin // host: mm registered with the driver for GPU-to-host batches
	read bool    // mapped for pulls (host: read-only), by its read key
	// set is the block request (Conn.set) that last named this mapping:
	// the cache never evicts one of the request in progress.
	set uint64
}

// Conn is a data path to one peer daemon on this host. Batches on it are
// serialised.
type Conn struct {
	transport.Handlers
	t    *Transport
	peer transport.Peer
	sock string // the peer's socket (its advert's)

	// mu serialises the conn's users (lock, lockCtx): a channel, so that
	// a batch waiting behind another one stuck on a stopped peer gives up
	// at its own deadline or cancel.
	mu chan struct{}
	// closing: Close began; no batch starts any more (bind).
	closing atomic.Bool
	c       *net.UnixConn
	broken  error
	closed  bool
	// errNow mirrors broken and closed for Err, which must not wait for a
	// batch in flight (the peer manager asks it holding the peer's lock).
	errNow  atomic.Pointer[error]
	cache   map[uint64]*remote
	streams map[int][]*gpudirect.Stream
	req     [requestSize]byte
	rep     [replySize]byte
	oob     []byte
	msg     []byte
	handle  [gpudirect.IPCHandleSize]byte
	dsts    []uint64
	srcs    []uint64
	sizes   []uint64
	// A block request's set (blocks.go): its number (remote.set), keys,
	// the slot of each key and of each group, the request and reply
	// buffers, and the descriptors a reply brought.
	set     uint64 // 0 outside a block request
	setSeq  uint64
	slots   []slot
	slotOf  map[uint64]int32
	groupOf []int32
	setBuf  []byte
	setOOB  []byte
	setFDs  []int
	// chunk is a block request's current chunk (blocks.go): a field, as
	// the copy hands it to its workers, so that it is not made per chunk.
	chunk desc.Batch
	// hostPool copies a large host batch's shares in parallel (one CPU
	// thread moves ~5 GB/s; TCP's streams beat that); started on first use.
	hostPool *hostPool
}

// Connect opens the data path to p, which must have proved it is on this
// host (Verify), and checks that the daemon behind the socket knows the
// token and answers with p's node name.
func (t *Transport) Connect(ctx context.Context, p transport.Peer) (transport.Conn, error) {
	ep, tok, err := verifyAdvert(p.Advert)
	if err != nil {
		return nil, fmt.Errorf("samehost: peer %s is not reachable on this host: %w", p.Address, err)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", ep.Socket)
	if err != nil {
		return nil, fmt.Errorf("%w: samehost: dial %s: %v", errs.ErrUnavailable, ep.Socket, err)
	}
	c := &Conn{t: t, peer: p, sock: ep.Socket, c: nc.(*net.UnixConn), mu: make(chan struct{}, 1), cache: map[uint64]*remote{}, streams: map[int][]*gpudirect.Stream{},
		oob: make([]byte, unix.CmsgSpace(4)), msg: make([]byte, 0, 256)}
	c.Handlers = transport.Handlers{Write: c.write, Read: c.read, WriteBlocks: c.writeBlocks, ReadBlocks: c.readBlocks, Warm: c.warm}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.c.SetDeadline(dl)
	}
	// A cancel cuts the hello, as it cuts a batch (bind): a peer that
	// accepted but does not answer (stopped) must not hold the caller to
	// its deadline.
	cut := context.AfterFunc(ctx, func() { _ = c.c.SetDeadline(time.Unix(1, 0)) })
	var h hello
	copy(h.token[:], tok)
	h.node = t.cfg.Node
	if len(h.node) > maxNode {
		h.node = h.node[:maxNode]
	}
	var r reply
	var msg []byte
	if _, werr := c.c.Write(h.marshal()); werr != nil {
		err = fmt.Errorf("%w: samehost: hello to %s: %v", errs.ErrUnavailable, ep.Socket, werr)
	} else {
		r, msg, _, err = c.readReply(false)
	}
	if !cut() { // ctx ended during the hello: the socket's deadline is spent
		_ = c.c.Close()
		return nil, fmt.Errorf("samehost: hello to %s cut off: %w", ep.Socket, ctx.Err())
	}
	if err == nil && r.status != statusOK {
		err = fmt.Errorf("%w: samehost: %s refused the connection: %s", statusErr(r.status), ep.Socket, msg)
	}
	if err == nil && p.Node != "" && string(msg) != p.Node {
		err = fmt.Errorf("%w: samehost: the daemon at %s is %q, not the peer %q that advertised it", errs.ErrFailedPrecondition, ep.Socket, msg, p.Node)
	}
	if err != nil {
		_ = c.c.Close()
		return nil, err
	}
	_ = c.c.SetDeadline(time.Time{})
	t.nconns.Add(1)
	return c, nil
}

// readReply reads one reply; fd is -1 unless one came. Only a reply that
// may carry a descriptor (wantFD) is read with recvmsg, which allocates; a
// descriptor sent with any other is closed by the kernel.
func (c *Conn) readReply(wantFD bool) (reply, []byte, int, error) {
	var n, oobn int
	var err error
	if wantFD {
		n, oobn, _, _, err = c.c.ReadMsgUnix(c.rep[:], c.oob)
	} else {
		n, err = io.ReadFull(c.c, c.rep[:])
	}
	fd := -1
	if oobn > 0 {
		if msgs, perr := unix.ParseSocketControlMessage(c.oob[:oobn]); perr == nil {
			for _, m := range msgs {
				if fds, ferr := unix.ParseUnixRights(&m); ferr == nil {
					for _, f := range fds {
						if fd < 0 {
							fd = f
						} else {
							_ = unix.Close(f)
						}
					}
				}
			}
		}
	}
	closeFD := func() {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
	if err == nil && n < replySize {
		_, err = io.ReadFull(c.c, c.rep[n:])
	}
	if err != nil {
		closeFD()
		return reply{}, nil, -1, c.fail(fmt.Errorf("read reply: %w", err))
	}
	r, err := parseReply(c.rep[:])
	if err != nil {
		closeFD()
		return reply{}, nil, -1, c.fail(err)
	}
	if wantFD && r.fds == 1 && fd < 0 {
		return reply{}, nil, -1, c.fail(fmt.Errorf("%w: the reply announced a descriptor that did not come", errs.ErrInvalidArgument))
	}
	c.msg = c.msg[:0]
	if r.msgLen > 0 {
		if cap(c.msg) < int(r.msgLen) {
			c.msg = make([]byte, 0, r.msgLen)
		}
		c.msg = c.msg[:r.msgLen]
		if _, err := io.ReadFull(c.c, c.msg); err != nil {
			closeFD()
			return reply{}, nil, -1, c.fail(fmt.Errorf("read reply message: %w", err))
		}
	}
	return r, c.msg, fd, nil
}

// fail marks the connection broken.
func (c *Conn) fail(err error) error {
	if c.broken == nil {
		c.broken = fmt.Errorf("%w: samehost connection to %s: %v", errs.ErrAborted, c.sock, err)
		if c.errNow.Load() == nil {
			c.errNow.Store(&c.broken)
		}
	}
	return c.broken
}

func (c *Conn) send(op, flags uint32, key, a, b uint64) error {
	r := request{op: op, flags: flags, key: key, a: a, b: b}
	r.put(c.req[:])
	if _, err := c.c.Write(c.req[:]); err != nil {
		return c.fail(fmt.Errorf("write request: %w", err))
	}
	return nil
}

// errClosed is Err's answer once the connection is closed.
var errClosed = fmt.Errorf("%w: samehost connection is closed", errs.ErrUnavailable)

// Err is nil while the connection is usable. It takes no lock: a batch in
// flight to a stopped peer holds c.mu up to its deadline, and the peer
// manager asks Err holding the peer's lock, which every call to that peer
// waits for.
func (c *Conn) Err() error {
	if p := c.errNow.Load(); p != nil {
		return *p
	}
	return nil
}

// Close unmaps every cached destination and closes the socket.
func (c *Conn) Close() error {
	// A batch in flight waits on the peer, maybe stopped, under its own
	// deadline; the manager closes a broken conn holding the peer's lock,
	// which every call to the peer waits for. So the batch's waits end at
	// once (a past deadline), before Close takes c.mu; a batch binding now
	// sees closing after setting its deadline, or its deadline is replaced.
	c.closing.Store(true)
	_ = c.c.SetDeadline(time.Unix(1, 0))
	c.lock()
	defer c.unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	closedErr := errClosed
	c.errNow.Store(&closedErr) // closed is told before broken, as it always was
	var err error
	for k, r := range c.cache {
		err = errors.Join(err, c.unmap(r))
		delete(c.cache, k)
	}
	if cu := c.t.cfg.CUDA; cu != nil {
		for d, ss := range c.streams {
			for _, s := range ss {
				err = errors.Join(err, cu.StreamDestroy(s))
			}
			delete(c.streams, d)
		}
	}
	c.hostPool.close()
	c.hostPool = nil
	err = errors.Join(err, c.c.Close())
	c.t.nconns.Add(-1)
	return err
}

// munmap unmaps a destination (a test checks what is still registered then).
var munmap = unix.Munmap

func (c *Conn) unmap(r *remote) error {
	switch {
	case r.mm != nil:
		err := c.t.unpin(&r.pin) // never leave the driver a registration of unmapped memory
		err = errors.Join(err, munmap(r.mm))
		r.mm, r.host = nil, nil
		return err
	case r.base != 0:
		err := c.t.cfg.CUDA.IPCCloseMemHandle(r.dev, r.base)
		r.base, r.dptr = 0, 0
		return staging.DomainError(err)
	}
	return nil
}

func (c *Conn) drop(key uint64) {
	if r := c.cache[key]; r != nil {
		if err := c.unmap(r); err != nil {
			c.t.log.Warn("samehost: unmap a destination", "error", err)
		}
		delete(c.cache, key)
	}
}

// Write copies b from src into dst: begin (pin, and the memory when not
// cached), the copies, end (the receiver records the landing).
func (c *Conn) write(ctx context.Context, src transport.Registration, dst transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	return c.transfer(ctx, src, dst, b, false)
}

// Read is a pull: the copy runs the other way, from the
// peer's region (mapped read-only by its read key) into dst. It returns
// after the copies ended (GPU: the streams synchronised), so no byte lands
// after it.
func (c *Conn) read(ctx context.Context, dst transport.Registration, src transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	return c.transfer(ctx, dst, src, b, true)
}

// boundCtx is a request's context bound to the socket: its deadline, and
// a cancellation that cuts a wait for the receiver short too (a receiver
// stalled before its reply held Write forever). A value, so that binding
// allocates nothing for a context that is never done.
type boundCtx struct {
	c        *Conn
	deadline bool
	stop     func() bool
	cut      chan struct{}
}

// lock takes c.mu for a use that does not wait on the peer; unlock lets
// it go.
func (c *Conn) lock()   { c.mu <- struct{}{} }
func (c *Conn) unlock() { <-c.mu }

// lockCtx takes c.mu unless ctx ends first: a batch queued behind another
// that waits on a stopped peer answers at its own deadline, not the other
// batch's. Nothing of the batch was sent then.
//
// It returns how long the batch waited, which its Stats count as post.
func (c *Conn) lockCtx(ctx context.Context) (time.Duration, error) {
	select {
	case c.mu <- struct{}{}:
		return 0, nil
	default:
	}
	t := time.Now()
	select {
	case c.mu <- struct{}{}:
		return time.Since(t), nil
	case <-ctx.Done():
		return 0, fmt.Errorf("samehost: %w while waiting for the connection to %s, busy with another batch (the peer may be stopped): %w", ctx.Err(), c.sock, transport.ErrNotSent)
	}
}

// bind checks, under c.mu, that the conn can carry a request now, and
// binds ctx to its socket; the caller defers the bind's release.
func (c *Conn) bind(ctx context.Context) (boundCtx, error) {
	b := boundCtx{c: c}
	if c.closed {
		return b, fmt.Errorf("%w: %w: samehost connection is closed", errs.ErrUnavailable, transport.ErrNotSent)
	}
	if c.broken != nil {
		return b, fmt.Errorf("%w: %w", transport.ErrNotSent, c.broken)
	}
	if err := ctx.Err(); err != nil {
		return b, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.c.SetDeadline(dl)
		b.deadline = true
	}
	if c.closing.Load() { // after the deadline above: see Close
		return b, fmt.Errorf("%w: %w: samehost connection is closing", errs.ErrUnavailable, transport.ErrNotSent)
	}
	if ctx.Done() != nil {
		cut := make(chan struct{})
		b.cut = cut
		b.stop = context.AfterFunc(ctx, func() {
			_ = c.c.SetDeadline(time.Unix(1, 0))
			close(cut)
		})
	}
	return b, nil
}

// release undoes the bind before the next request.
func (b boundCtx) release() {
	if b.stop != nil && !b.stop() {
		<-b.cut // it ran: undo it
		_ = b.c.c.SetDeadline(time.Time{})
	}
	if b.deadline {
		_ = b.c.c.SetDeadline(time.Time{})
	}
}

// transfer is Write (read false: local to the peer's region rr) and Read
// (read: rr to local; b.Src are then rr's offsets).
func (c *Conn) transfer(ctx context.Context, src transport.Registration, dst transport.RemoteRegion, b *desc.Batch, read bool) (st transport.Stats, err error) {
	if b.N() == 0 {
		return st, nil
	}
	sm := src.Memory()
	waited, err := c.lockCtx(ctx)
	if err != nil {
		return st, err
	}
	defer c.unlock()
	defer func() { st.Post += waited }() // a batch queued behind another: handed over late
	bound, err := c.bind(ctx)
	if err != nil {
		return st, err
	}
	defer bound.release()
	key := dst.Key.Key
	rm, err := c.begin(ctx, dst, sm, read)
	if err != nil {
		return st, err
	}
	srcLen, dstLen := sm.Len, rm.size
	if read {
		srcLen, dstLen = rm.size, sm.Len
	}
	if err := checkBounds(b, srcLen, dstLen); err != nil {
		_ = c.abort()
		return st, err
	}
	c.pinHostSide(src, sm, rm)
	st.Post, err = c.copy(ctx, sm, rm, b, read)
	st.Segments = uint64(b.N())
	st.WorkRequests = 1
	if err != nil {
		_ = c.abort()
		return st, err
	}
	var endFlags uint32
	if read {
		endFlags = flagRead
	}
	if err := c.end(ctx, endFlags, key, uint64(b.N()), b.Bytes()); err != nil {
		return st, err
	}
	return st, nil
}

// end tells the receiver the copies of a batch (key: its region) or of a
// block set (key 0) ended, segs blocks of n bytes, and waits for its
// acknowledgement. c.mu is held.
func (c *Conn) end(ctx context.Context, flags uint32, key, segs, n uint64) error {
	if err := c.send(opEnd, flags, key, segs, n); err != nil {
		return c.ctxErr(ctx, err)
	}
	r, msg, _, err := c.readReply(false)
	if err != nil {
		return c.ctxErr(ctx, err)
	}
	if r.status != statusOK {
		return c.fail(fmt.Errorf("end refused: %s", msg))
	}
	return nil
}

// begin pins dst on the receiver and returns its mapping in this process,
// made (and cached) when not cached yet. On success the pin is held until
// the caller's end or abort. c.mu is held.
func (c *Conn) begin(ctx context.Context, dst transport.RemoteRegion, sm memory.Memory, read bool) (*remote, error) {
	key := dst.Key.Key
	rm := c.cache[key]
	if rm != nil && rm.read != read {
		c.drop(key) // never a read-only mapping for a write, nor the reverse
		rm = nil
	}
	if rm != nil && rm.kind == kindCUDA && sm.Kind == memory.CUDA && rm.dev != sm.Device {
		c.drop(key) // opened on another device: open again on the source's
		rm = nil
	}
	var flags uint32
	if rm == nil {
		flags = flagMap
	}
	if read {
		flags |= flagRead
	}
	if err := c.send(opBegin, flags, key, 0, 0); err != nil {
		return nil, c.ctxErr(ctx, err)
	}
	r, msg, fd, err := c.readReply(flags&flagMap != 0)
	if err != nil {
		return nil, c.ctxErr(ctx, err)
	}
	if r.status != statusOK {
		// A refused key (deregistered, un-exported, rekeyed) drops what we
		// mapped for it.
		c.drop(key)
		if read {
			return nil, fmt.Errorf("%w: samehost: peer refused the read of region %q: %s", statusErr(r.status), dst.Name, msg)
		}
		return nil, fmt.Errorf("%w: samehost: peer refused dst_region %q: %s", statusErr(r.status), dst.Name, msg)
	}
	if rm == nil {
		var handle []byte
		if r.kind == kindCUDA {
			// Read whatever follows, so that a failure to open it leaves
			// the stream in step for the abort.
			if _, err := io.ReadFull(c.c, c.handle[:]); err != nil {
				if fd >= 0 {
					_ = unix.Close(fd)
				}
				return nil, c.ctxErr(ctx, c.fail(fmt.Errorf("read IPC handle: %w", err)))
			}
			handle = c.handle[:]
		}
		t0 := time.Now()
		rm, err = c.mapRemote(r.kind, r.size, r.offset, msg, handle, fd, sm, read)
		if err != nil {
			_ = c.abort()
			return nil, err
		}
		// Once per (connection, destination): the one-off cost of a batch
		// that was not warmed (Warm, PrepareTransfer), named.
		c.t.log.Debug("samehost: mapped a destination", "dst_region", dst.Name, "bytes", rm.size, "took", time.Since(t0))
		c.cacheAdd(key, rm)
	} else if fd >= 0 {
		_ = unix.Close(fd)
	}
	return rm, nil
}

// cacheAdd caches rm under key, first evicting one mapping when the cache
// is full: never one of the block request in progress (c.set), whose
// copies have yet to run (a set has fewer keys than the cache holds).
func (c *Conn) cacheAdd(key uint64, rm *remote) {
	if len(c.cache) >= maxCached {
		for k, old := range c.cache {
			if c.set == 0 || old.set != c.set {
				c.drop(k)
				break
			}
		}
	}
	rm.set = c.set
	c.cache[key] = rm
}

// ctxErr prefers the caller's deadline over the I/O error it caused.
func (c *Conn) ctxErr(ctx context.Context, err error) error {
	ce := ctx.Err()
	if d, ok := ctx.Deadline(); ce == nil && ok && !time.Now().Before(d) {
		// The socket's deadline fired before ctx's timer did.
		ce = context.DeadlineExceeded
	}
	if ce != nil {
		return fmt.Errorf("samehost: %w (%v)", ce, err)
	}
	return err
}

func (c *Conn) abort() error {
	if err := c.send(opAbort, 0, 0, 0, 0); err != nil {
		return err
	}
	_, _, _, err := c.readReply(false)
	return err
}

// checkBounds re-checks the batch against both regions' real sizes.
func checkBounds(b *desc.Batch, srcLen, dstLen uint64) error {
	for i := range b.Len {
		n := b.Len[i]
		if s := b.Src[i]; s > srcLen || n > srcLen-s {
			return fmt.Errorf("%w: block %d: source [%d, +%d) leaves the %d-byte region", errs.ErrInvalidArgument, i, s, n, srcLen)
		}
		if d := b.Dst[i]; d > dstLen || n > dstLen-d {
			return fmt.Errorf("%w: block %d: destination [%d, +%d) leaves the %d-byte region", errs.ErrInvalidArgument, i, d, n, dstLen)
		}
	}
	return nil
}

// mapRemote maps the destination a begin's reply handed over: a host
// region's descriptor fd (mapRemote closes it) at offset, or a GPU's IPC
// handle with its bus id (msg). size is the region's.
func (c *Conn) mapRemote(kind uint32, size, offset uint64, msg, handle []byte, fd int, sm memory.Memory, read bool) (*remote, error) {
	rm := &remote{kind: kind, size: size, read: read}
	switch kind {
	case kindHost:
		if fd < 0 {
			return nil, c.fail(fmt.Errorf("%w: host destination came without its descriptor", errs.ErrInvalidArgument))
		}
		defer unix.Close(fd)
		page := uint64(os.Getpagesize())
		off := offset &^ (page - 1)
		delta := offset - off
		if size == 0 || size > 1<<46 {
			return nil, fmt.Errorf("%w: samehost: destination size %d", errs.ErrInvalidArgument, size)
		}
		// MAP_POPULATE: the receiver's pages exist already (the registry
		// maps regions populated), but this fresh mapping has no page-table
		// entries; made here in one call they cost a quarter of what the
		// copy's page faults would (35 ms against 150 ms for 512 MiB).
		prot := unix.PROT_READ | unix.PROT_WRITE
		if read { // a pull's source: this daemon cannot write it by mistake
			prot = unix.PROT_READ
		}
		mm, err := unix.Mmap(fd, int64(off), int(delta+size), prot, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return nil, fmt.Errorf("%w: samehost: map the destination (%d bytes at %d): %v", errs.ErrFailedPrecondition, size, offset, err)
		}
		rm.mm, rm.host = mm, mm[delta:delta+size]
		return rm, nil
	case kindCUDA:
		if fd >= 0 {
			_ = unix.Close(fd)
		}
		cu := c.t.cfg.CUDA
		if cu == nil {
			return nil, fmt.Errorf("%w: samehost: the destination is GPU memory and this daemon has no CUDA driver", errs.ErrFailedPrecondition)
		}
		dev := sm.Device
		home, visible := c.t.busIDs[string(msg)]
		if !visible {
			home = -1
		}
		if sm.Kind != memory.CUDA {
			if !visible {
				return nil, fmt.Errorf("%w: samehost: the destination's GPU %q is not visible to this daemon", errs.ErrFailedPrecondition, msg)
			}
			dev = home
		}
		if len(handle) != gpudirect.IPCHandleSize {
			return nil, c.fail(fmt.Errorf("%w: GPU destination came without its IPC handle", errs.ErrInvalidArgument))
		}
		if c.sock == c.t.ep.Socket {
			// The peer is this daemon (two clients of one daemon, or its
			// calibration): CUDA refuses to open a process's own IPC
			// handle, and the region is mapped here already. Its pins
			// (begin) keep it registered while a batch uses the pointer.
			ptr, own, ok := c.t.ownCUDA(gpudirect.IPCHandle(handle), offset)
			if !ok {
				return nil, fmt.Errorf("%w: samehost: the destination's IPC handle is this daemon's, but no region of it has that handle", errs.ErrFailedPrecondition)
			}
			if dev != own {
				// The copies run on the source's GPU. An application's
				// allocation (imported by its IPC handle) is opened again
				// in that GPU's context, as a peer daemon opens it: copies
				// whose pointers are all the queueing context's own scale
				// over the parts' threads, while one mapped in the other
				// GPU's context serialises them (10,000 x 128 B GPU0 ->
				// GPU1 in four parts: 5.1 against 11.6 ms, peerprobe.cu
				// ipc-par4 and ipc1-par4). Our own allocation cannot be
				// (CUDA refuses a process's own handles): it is reached
				// by peer access.
				if base, err := cu.IPCOpenMemHandle(dev, gpudirect.IPCHandle(handle)); err == nil {
					rm.base, rm.dptr, rm.dev, rm.home = base, base+uintptr(offset), dev, own
					return rm, nil
				}
				if err := cu.EnablePeerAccess(dev, own); err != nil {
					return nil, fmt.Errorf("%w: samehost: a batch between GPU %d and this daemon's own region on GPU %d needs peer access: %v; give the source on GPU %d, or another transport (tcp)", errs.ErrFailedPrecondition, dev, own, staging.DomainError(err), own)
				}
			}
			rm.dptr, rm.dev, rm.home = ptr, dev, own
			return rm, nil
		}
		base, err := cu.IPCOpenMemHandle(dev, gpudirect.IPCHandle(handle))
		if err != nil {
			return nil, fmt.Errorf("samehost: open the destination's IPC handle on device %d: %w", dev, staging.DomainError(err))
		}
		rm.base, rm.dptr, rm.dev, rm.home = base, base+uintptr(offset), dev, home
		return rm, nil
	}
	if fd >= 0 {
		_ = unix.Close(fd)
	}
	return nil, c.fail(fmt.Errorf("%w: reply memory kind %d", errs.ErrInvalidArgument, kind))
}
