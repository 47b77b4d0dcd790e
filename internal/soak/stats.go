package soak

import (
	"fmt"
	"hash/crc32"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crcBlocks is the CRC32C of the blocks of mem at offs, each n bytes long,
// in order.
func crcBlocks(mem []byte, offs []uint64, n uint64) uint32 {
	var c uint32
	for _, o := range offs {
		c = crc32.Update(c, castagnoli, mem[o:o+n])
	}
	return c
}

// kindStats counts one kind of transfer's outcomes.
type kindStats struct {
	transfers, done, cancelled, deadline, failed atomic.Uint64
}

// Violation is one broken invariant, kept for the report (the first few of
// each kind).
type Violation struct {
	Invariant string `json:"invariant"`
	Kind      string `json:"kind"`
	Worker    int    `json:"worker"`
	Detail    string `json:"detail"`
	At        string `json:"at"`
}

const keepViolations = 20

// stats is the run's counters, shared by the workers and the chaos loop.
type stats struct {
	mu    sync.Mutex
	kinds map[string]*kindStats

	falseSuccess, grantViolations   atomic.Uint64
	lateBytes, lateBytesChaos       atomic.Uint64 // cut transfers whose destination changed after the answer
	lateBytesUnconfirmed            atomic.Uint64 // ... within what an unconfirmed cut's answer allowed (not counted)
	lateChecked                     atomic.Uint64
	overruns, overrunsPeerChaos     atomic.Uint64 // answers past deadline + slack: clean, and with the peer frozen or killed
	overrunsLocalChaos              atomic.Uint64 // the client's own daemon was frozen or killed: classified apart
	chaosAffected                   atomic.Uint64 // calls that overlapped a chaos action on one of their daemons
	workerKilled                    atomic.Uint64
	setupErrors, faults             atomic.Uint64
	truncations, relayouts, narrows atomic.Uint64
	worstLate                       atomic.Int64 // ns past the deadline, clean calls
	cancelOverruns                  atomic.Uint64
	worstCancel                     atomic.Int64
	checks                          atomic.Uint64
	// The two-host form's: DONE transfers whose remote destination could
	// not be read (an invariant), pulls skipped with the wire down, cut
	// transfers' re-checks lost (the remote region went) and remote
	// snapshots taken only once the wire was back.
	unverified, skippedWire, recheckLost, snapshotLate atomic.Uint64
	withinMargin                                       atomic.Uint64 // clean answers past deadline + 100 ms, within the measured margin
	overrunsAnswerWire                                 atomic.Uint64 // the remote daemon's answers past the slack with the wire down meanwhile

	vmu        sync.Mutex
	violations []Violation
	vcount     map[string]int
	errCodes   map[string]uint64
	errSample  map[string]string
}

func newStats() *stats {
	return &stats{kinds: map[string]*kindStats{}, vcount: map[string]int{}, errCodes: map[string]uint64{}, errSample: map[string]string{}}
}

func (s *stats) kind(k string) *kindStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.kinds[k]
	if ks == nil {
		ks = &kindStats{}
		s.kinds[k] = ks
	}
	return ks
}

func (s *stats) violation(inv, kind string, worker int, format string, args ...any) {
	s.vmu.Lock()
	defer s.vmu.Unlock()
	s.vcount[inv]++
	if s.vcount[inv] <= keepViolations {
		s.violations = append(s.violations, Violation{Invariant: inv, Kind: kind, Worker: worker,
			Detail: fmt.Sprintf(format, args...), At: time.Now().UTC().Format(time.RFC3339Nano)})
	}
}

func (s *stats) errCode(kind, code string, err error) {
	k := kind + " " + code
	s.vmu.Lock()
	s.errCodes[k]++
	if _, ok := s.errSample[k]; !ok {
		s.errSample[k] = err.Error()
	}
	s.vmu.Unlock()
}

// KindReport is one transfer kind's counts.
type KindReport struct {
	Transfers uint64 `json:"transfers"`
	Done      uint64 `json:"done"`
	Cancelled uint64 `json:"cancelled"`
	Deadline  uint64 `json:"deadline_exceeded"`
	Failed    uint64 `json:"failed"`
}

func (s *stats) kindReports() (map[string]KindReport, KindReport) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]KindReport{}
	var sum KindReport
	names := make([]string, 0, len(s.kinds))
	for k := range s.kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		ks := s.kinds[k]
		r := KindReport{Transfers: ks.transfers.Load(), Done: ks.done.Load(), Cancelled: ks.cancelled.Load(),
			Deadline: ks.deadline.Load(), Failed: ks.failed.Load()}
		out[k] = r
		sum.Transfers += r.Transfers
		sum.Done += r.Done
		sum.Cancelled += r.Cancelled
		sum.Deadline += r.Deadline
		sum.Failed += r.Failed
	}
	return out, sum
}

func (s *stats) noteCancelLate(d time.Duration) {
	for o := s.worstCancel.Load(); int64(d) > o && !s.worstCancel.CompareAndSwap(o, int64(d)); o = s.worstCancel.Load() {
	}
}

func (s *stats) noteLate(d time.Duration) {
	for o := s.worstLate.Load(); int64(d) > o && !s.worstLate.CompareAndSwap(o, int64(d)); o = s.worstLate.Load() {
	}
}
