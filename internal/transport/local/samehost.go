// Package samehost is the same-host data path (transport kind "local"):
// between two daemons that proved they share a host (proof.go), the sender
// writes straight into the receiver's memory. Host regions: the receiver
// hands the sender its region file's descriptor over a Unix socket
// (SCM_RIGHTS) and the sender maps it and copies. GPU regions: the receiver
// hands the sender a CUDA IPC handle and the sender copies with copy engines
// (one cuMemcpyBatchAsync per batch on a stream; never a kernel). Every
// batch pins the destination key on the receiver first (begin), so the
// registry's export rules and revocation (rekeying) apply batch by batch:
// the sender's cached mapping is only used between a granted pin and the
// receiver's acknowledgement (end), and a refused pin drops it.
package local

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/staging"
	"github.com/b2bd/b2bd/internal/transport"
)

// Config configures the transport.
type Config struct {
	// Dir holds the Unix socket and the token file: the daemon's shm dir
	// (0770, the b2bd group), so only the daemon's user, root and the group
	// reach them.
	Dir string
	// Group is the gid given to the token file and the socket; 0: none.
	Group int
	// Node is this daemon's node name, checked by the peer at connection.
	Node string
	// CUDA is the GPU driver; nil: host regions only.
	CUDA gpudirect.Interface
	// Streams is how many streams (copy-engine queues) a GPU batch is
	// spread over, by bytes, once it carries at least MinSplit bytes per
	// stream; 0 or 1: one stream, one cuMemcpyBatchAsync.
	Streams int
	// StageBytes is the pinned host buffer per device that same-device GPU
	// batches are staged through (two halves); 0: DefaultStageBytes.
	StageBytes int
	// SameDeviceDirect copies same-device GPU batches directly (device to
	// device) instead of staging them: faster for large blocks, but the
	// driver runs those copies as kernels on the SMs.
	SameDeviceDirect bool
}

// DefaultStageBytes is Config.StageBytes' default: two 32 MiB halves.
const DefaultStageBytes = 64 << 20

// MinSplit is the least share of a batch worth a stream of its own.
const MinSplit = 1 << 20

// MinSplitBlock is the least average block worth spreading a GPU batch
// over several streams. Measured GPU0 -> GPU1 on two H200s (10,000 blocks,
// prepared, three rounds): at 4 KiB four streams took 9.9-11.7 ms against
// 7.4-7.8 on one; from 64 KiB up four win (64 KiB 7.3-8.1 against 8.6-12.9,
// 256 KiB 9.4-9.9 against 13.2-16.1).
const MinSplitBlock = 64 << 10

// gpuShares is how many streams a GPU batch of n blocks and total bytes is
// spread over, with streams available.
func gpuShares(n int, total uint64, streams int) int {
	k := min(streams, n)
	if total/MinSplit < uint64(k) {
		k = int(total / MinSplit)
	}
	if n > 0 && total/uint64(n) < MinSplitBlock {
		k = 1
	}
	return max(k, 1)
}

// gpuParts is how many parts a GPU batch of n copies is queued in, on as
// many of its streams, where it is not spread by bytes: one part per
// MinPartCopies copies, at most gpudirect.ParallelParts.
func gpuParts(n, streams int) int {
	return max(1, min(streams, gpudirect.ParallelParts, n/MinPartCopies))
}

// MinPartCopies is the fewest copies a part of a GPU batch gets.
const MinPartCopies = 512

// MaxStreams bounds Config.Streams.
const MaxStreams = 8

// Transport is the same-host transport.
type Transport struct {
	transport.Quiet // HandleSignal: the same-host path sets up over its own socket
	cfg             Config
	in              transport.Inbound
	log             hclog.Logger
	ln              *net.UnixListener
	token           []byte
	ep              Endpoint
	busIDs          map[string]int // CUDA: PCI bus id -> this process's ordinal

	mu     sync.Mutex
	closed bool
	regs   map[uint64]*registration // by key
	conns  map[*serverConn]struct{}
	wg     sync.WaitGroup
	nconns atomic.Int64 // live connections, both directions
	// served counts the requests this daemon's server answered, by op
	// (tests count a block request's exchanges with it).
	served [opBeginSet + 1]atomic.Uint64

	// Same-device staging, per device (stage.go): made at registration.
	stageMu  sync.Mutex
	stages   map[int]*stage
	stageErr map[int]error

	// Host memory the driver refused to register (pin.go).
	pinMu    sync.Mutex
	pinFails int
	pinErr   error
}

// New creates the token file and the socket in cfg.Dir and starts serving.
func New(cfg Config, in transport.Inbound, log hclog.Logger) (*Transport, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if cfg.Streams < 0 || cfg.Streams > MaxStreams {
		return nil, fmt.Errorf("%w: --local-streams %d: want 1 to %d", errs.ErrInvalidArgument, cfg.Streams, MaxStreams)
	}
	if cfg.Streams == 0 {
		cfg.Streams = 1
	}
	if cfg.StageBytes < 0 || (cfg.StageBytes > 0 && cfg.StageBytes < 2*staging.MinStagedChunk) {
		return nil, fmt.Errorf("%w: samehost: staging buffer %d bytes: want 0 (default %d) or at least %d", errs.ErrInvalidArgument, cfg.StageBytes, DefaultStageBytes, 2*staging.MinStagedChunk)
	}
	if cfg.StageBytes == 0 {
		cfg.StageBytes = DefaultStageBytes
	}
	if cfg.Dir == "" {
		return nil, fmt.Errorf("%w: samehost: no directory for the socket and token", errs.ErrInvalidArgument)
	}
	boot, err := BootID()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("samehost: create %s: %w", cfg.Dir, err)
	}
	dir, err := filepath.EvalSymlinks(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("samehost: resolve %s: %w", cfg.Dir, err)
	}
	reclaimStale(dir, log)
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	base := filepath.Join(dir, filePrefix+hex.EncodeToString(rnd[:]))
	t := &Transport{cfg: cfg, in: in, log: log, regs: map[uint64]*registration{}, conns: map[*serverConn]struct{}{}, busIDs: map[string]int{},
		stages: map[int]*stage{}, stageErr: map[int]error{}}
	t.token, err = newToken(base+".token", cfg.Group)
	if err != nil {
		return nil, err
	}
	sock := base + ".sock"
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		_ = os.Remove(base + ".token")
		return nil, fmt.Errorf("samehost: listen on %s: %w", sock, err)
	}
	ln.SetUnlinkOnClose(true)
	if cfg.Group > 0 {
		_ = os.Chown(sock, -1, cfg.Group)
	}
	if err := os.Chmod(sock, 0o660); err != nil {
		_ = ln.Close()
		_ = os.Remove(base + ".token")
		return nil, fmt.Errorf("samehost: chmod %s: %w", sock, err)
	}
	t.ln = ln
	t.ep = Endpoint{BootID: boot, Socket: sock, TokenPath: base + ".token", TokenDigest: Digest(t.token)}
	if cfg.CUDA != nil {
		for i := 0; i < cfg.CUDA.DeviceCount(); i++ {
			if di, err := cfg.CUDA.DeviceInfo(i); err == nil {
				t.busIDs[di.PCIBusID] = i
			}
		}
	}
	t.wg.Add(1)
	go t.serve()
	return t, nil
}

// Kind is transport.Local.
func (t *Transport) Kind() transport.Kind { return transport.Local }

// Advertise implements transport.Advertiser.
func (t *Transport) Advertise() transport.Advert {
	return transport.Advert{Kind: transport.Local, Detail: "socket " + t.ep.Socket + ", boot " + t.ep.BootID + t.routes(), Data: MarshalEndpoint(t.ep)}
}

// Endpoint is what this daemon advertises.
func (t *Transport) Endpoint() Endpoint { return t.ep }

// Reaches reports whether the peer whose local advert is advert is on
// this host (nil) or why not: the same-host proof.
func (t *Transport) Reaches(advert []byte) error {
	_, _, err := verifyAdvert(advert)
	return err
}

// Resources implements transport.Counter.
// Status is the transport's live handles (Resources).
func (t *Transport) Status() transport.Status { return transport.Status{Resources: t.Resources()} }

func (t *Transport) Resources() transport.Resources {
	return transport.Resources{Connections: int(t.nconns.Load())}
}

// Close stops serving, drops every connection and removes the files.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	conns := make([]*serverConn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	err := t.ln.Close()
	for _, c := range conns {
		_ = c.c.Close()
	}
	t.wg.Wait()
	t.stageMu.Lock()
	for d, s := range t.stages {
		err = errors.Join(err, s.close(t.cfg.CUDA))
		delete(t.stages, d)
	}
	t.stageMu.Unlock()
	if rerr := os.Remove(t.ep.TokenPath); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	if err != nil && errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// ---- registrations ---------------------------------------------------------

type registration struct {
	transport.SingleKey // Withdraw, Rails
	t                   *Transport
	mem                 memory.Memory

	mu  sync.Mutex
	key uint64
	// readKey pins the region for pulls only (flagRead), key for writes
	// only: both index t.regs.
	readKey uint64
	// What a peer needs to reach the memory; shareErr says why it cannot.
	file      *os.File // host: the region's file
	fileOff   uint64   // host: the region's offset in it
	handle    gpudirect.IPCHandle
	handleOff uint64
	busID     string
	shareErr  error
	closed    bool
	pin       hostPin // host: registered with the driver as a host-to-GPU source
}

func randomKey() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if k := binary.LittleEndian.Uint64(b[:]); k != 0 {
			return k
		}
	}
}

// Register makes m usable as a source and a destination. A region a peer
// cannot reach (not a file mapping; device memory the driver will not
// share) still registers, as a source; a peer's batch into it is refused
// with the reason.
// ownCUDA finds this daemon's own GPU region by the IPC handle and offset
// its receiving side handed out: its device pointer and device.
func (t *Transport) ownCUDA(h gpudirect.IPCHandle, off uint64) (ptr uintptr, dev int, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.regs {
		if r.mem.Kind == memory.CUDA && r.shareErr == nil && r.handle == h && r.handleOff == off {
			return r.mem.Addr, r.mem.Device, true
		}
	}
	return 0, 0, false
}

func (t *Transport) Register(m memory.Memory) (transport.Registration, error) {
	r := &registration{t: t, mem: m}
	switch m.Kind {
	case memory.Host:
		r.file, r.fileOff, r.shareErr = openBacking(m)
	case memory.CUDA:
		if t.cfg.CUDA == nil {
			return nil, fmt.Errorf("%w: samehost: GPU memory needs the CUDA driver, which this daemon has not loaded", errs.ErrFailedPrecondition)
		}
		t.ensureStage(m.Device)
		h, off, err := gpudirect.ShareHandle(t.cfg.CUDA, m.Device, m.Addr, m.Len)
		if err != nil {
			r.shareErr = staging.DomainError(err)
		} else {
			r.handle, r.handleOff = h, off
			if di, err := t.cfg.CUDA.DeviceInfo(m.Device); err == nil {
				r.busID = di.PCIBusID
			}
		}
	default:
		return nil, fmt.Errorf("%w: samehost: memory kind %v", errs.ErrInvalidArgument, m.Kind)
	}
	if r.shareErr != nil {
		t.log.Debug("region registered as a source only", "kind", m.Kind, "reason", r.shareErr)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		if r.file != nil {
			_ = r.file.Close()
		}
		return nil, fmt.Errorf("%w: samehost transport is closed", errs.ErrUnavailable)
	}
	r.key = randomKey()
	for t.regs[r.key] != nil {
		r.key = randomKey()
	}
	t.regs[r.key] = r
	r.readKey = randomKey()
	for t.regs[r.readKey] != nil {
		r.readKey = randomKey()
	}
	t.regs[r.readKey] = r
	return r, nil
}

// openBacking opens the file mapped at m and checks it is the mapped inode.
func openBacking(m memory.Memory) (*os.File, uint64, error) {
	mp, err := findMapping(m.Addr, m.Len)
	if err != nil {
		return nil, 0, err
	}
	if mp.inode == 0 || mp.path == "" || mp.path[0] != '/' {
		return nil, 0, fmt.Errorf("%w: samehost: %#x is not a file mapping (%q)", errs.ErrInvalidArgument, m.Addr, mp.path)
	}
	f, err := os.OpenFile(mp.path, os.O_RDWR, 0)
	if err != nil {
		// A file with no path (a client's memfd, "/memfd:NAME (deleted)",
		// or an unlinked file) opens through the mapping itself; that
		// needs CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN, which a daemon
		// run as root has. The inode check below still applies.
		byMap := fmt.Sprintf("/proc/self/map_files/%x-%x", mp.start, mp.end)
		var err2 error
		if f, err2 = os.OpenFile(byMap, os.O_RDWR, 0); err2 != nil {
			return nil, 0, fmt.Errorf("samehost: open the region's file %s: %w (and through %s: %v)", mp.path, err, byMap, err2)
		}
	}
	if err := sameInode(f, mp); err != nil {
		_ = f.Close()
		return nil, 0, err
	}
	return f, mp.offset + uint64(m.Addr-mp.start), nil
}

func (r *registration) Memory() memory.Memory { return r.mem }

func (r *registration) Key() transport.RemoteKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	return transport.RemoteKey{Key: r.key}
}

// Rekey replaces the write key: the old key stops pinning at once
// (the registry drops it from its index), so a sender's next batch with it
// is refused and its cached mapping dropped.
func (r *registration) Rekey() (transport.RemoteKey, error) {
	t := r.t
	t.mu.Lock()
	defer t.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.replaceKey(&r.key)
}

// replaceKey puts a fresh key in *key (r.key or r.readKey) and drops the
// old one from the index, so that it pins nothing any more; it returns
// the old one. t.mu and r.mu held.
func (r *registration) replaceKey(key *uint64) (transport.RemoteKey, error) {
	if r.closed {
		return transport.RemoteKey{}, fmt.Errorf("%w: samehost registration is closed", errs.ErrNotFound)
	}
	t := r.t
	old := *key
	k := randomKey()
	for t.regs[k] != nil {
		k = randomKey()
	}
	delete(t.regs, old)
	*key = k
	t.regs[k] = r
	return transport.RemoteKey{Key: old}, nil
}

// KeyFor is the write or the read key.
func (r *registration) KeyFor(a transport.Access) (transport.RemoteKey, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch a {
	case transport.AccessWrite:
		return transport.RemoteKey{Key: r.key}, nil
	case transport.AccessRead:
		return transport.RemoteKey{Key: r.readKey}, nil
	}
	return transport.RemoteKey{}, fmt.Errorf("%w: samehost: no single key grants %s", errs.ErrInvalidArgument, a)
}

// RekeyFor replaces the read key alone (the write key: Rekey).
func (r *registration) RekeyFor(a transport.Access) (transport.RemoteKey, error) {
	if a == transport.AccessWrite {
		return r.Rekey()
	}
	if a != transport.AccessRead {
		return transport.RemoteKey{}, fmt.Errorf("%w: samehost: rekey %s", errs.ErrInvalidArgument, a)
	}
	t := r.t
	t.mu.Lock()
	defer t.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.replaceKey(&r.readKey)
}

func (r *registration) Close() error {
	t := r.t
	t.mu.Lock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		t.mu.Unlock()
		return nil
	}
	r.closed = true
	if t.regs[r.key] == r {
		delete(t.regs, r.key)
	}
	if t.regs[r.readKey] == r {
		delete(t.regs, r.readKey)
	}
	f := r.file
	r.file = nil
	// Before the registry unmaps the memory.
	err := t.unpin(&r.pin)
	r.mu.Unlock()
	t.mu.Unlock()
	if f != nil {
		err = errors.Join(err, f.Close())
	}
	return err
}

// lookup is the registration holding key, for the server.
func (t *Transport) lookup(key uint64) *registration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.regs[key]
}

// filePrefix names the transport's files in the shm dir: <prefix><rand>.sock
// and <prefix><rand>.token (the registry's reserved ".b2bd-" prefix, so
// clients cannot import them).
const filePrefix = ".b2bd-local-"

// reclaimStale removes the socket and token of daemons that died without
// closing (kill -9): a socket nobody listens on refuses connections.
func reclaimStale(dir string, log hclog.Logger) {
	socks, _ := filepath.Glob(filepath.Join(dir, filePrefix+"*.sock"))
	for _, s := range socks {
		c, err := net.DialTimeout("unix", s, time.Second)
		if err == nil {
			_ = c.Close()
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			continue
		}
		tok := strings.TrimSuffix(s, ".sock") + ".token"
		_ = os.Remove(s)
		_ = os.Remove(tok)
		log.Info("removed the local-transport files of a dead daemon", "socket", s)
	}
}
