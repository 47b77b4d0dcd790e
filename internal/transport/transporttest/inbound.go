package transporttest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// Inbound is the receiving daemon as the suite plays it: a key index of
// live registrations (as the region registry keeps, moved by Rekey and
// dropped by deregistration), a count of pins and landed bytes, and a gate
// that stalls Pin, so a test can hold a receiver before it places a byte.
type Inbound struct {
	kind transport.Kind

	mu   sync.Mutex
	regs map[uint64]memory.Memory
	// reads index the registrations' read keys (PinRead), as the registry
	// does for exports with readers.
	reads map[uint64]memory.Memory
	held  int // pins not yet released
	inPin int // Pin calls waiting at the gate
	gate  chan struct{}
	// entered receives once per Pin call that reached a closed gate.
	entered chan struct{}
	// wrongKind: a Pin or Landed named another kind than the transport's.
	wrongKind error
	// unpin is made once, so that Pin does not allocate (prepared Writes
	// are checked with AllocsPerRun, which counts every goroutine).
	unpin func()

	landedBytes, landedBlocks, landedCalls atomic.Uint64
}

func newInbound(k transport.Kind) *Inbound {
	in := &Inbound{kind: k, regs: map[uint64]memory.Memory{}, reads: map[uint64]memory.Memory{}, entered: make(chan struct{}, 64)}
	in.unpin = func() {
		in.mu.Lock()
		in.held--
		in.mu.Unlock()
	}
	return in
}

// Pin implements transport.Inbound.
func (in *Inbound) Pin(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	return in.pin(k, key, false)
}

// PinRead implements transport.Inbound.PinRead: only read keys pin.
func (in *Inbound) PinRead(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	return in.pin(k, key, true)
}

func (in *Inbound) pin(k transport.Kind, key uint64, read bool) (memory.Memory, func(), error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if k != in.kind && in.wrongKind == nil {
		in.wrongKind = fmt.Errorf("Pin named kind %q, the transport is %q", k, in.kind)
	}
	for in.gate != nil {
		gate := in.gate
		in.inPin++
		in.mu.Unlock()
		select {
		case in.entered <- struct{}{}:
		default:
		}
		<-gate
		in.mu.Lock()
		in.inPin--
	}
	regs := in.regs
	if read {
		regs = in.reads
	}
	m, ok := regs[key]
	if !ok {
		return memory.Memory{}, nil, fmt.Errorf("transporttest inbound: no live %s registration has key %#x: %w", k, key, errs.ErrNotFound)
	}
	in.held++
	return m, in.unpin, nil
}

// Landed implements transport.Inbound.
func (in *Inbound) Landed(k transport.Kind, blocks, bytes uint64) {
	if k != in.kind {
		in.mu.Lock()
		if in.wrongKind == nil {
			in.wrongKind = fmt.Errorf("Landed named kind %q, the transport is %q", k, in.kind)
		}
		in.mu.Unlock()
	}
	in.landedCalls.Add(1)
	in.landedBlocks.Add(blocks)
	in.landedBytes.Add(bytes)
}

func (in *Inbound) add(key uint64, m memory.Memory) {
	in.mu.Lock()
	in.regs[key] = m
	in.mu.Unlock()
}

func (in *Inbound) remove(key uint64) {
	in.mu.Lock()
	delete(in.regs, key)
	delete(in.reads, key)
	in.mu.Unlock()
}

func (in *Inbound) addRead(key uint64, m memory.Memory) {
	in.mu.Lock()
	in.reads[key] = m
	in.mu.Unlock()
}

// move is what the registry does on Rekey: the index follows the new key.
func (in *Inbound) move(old, new uint64) {
	in.mu.Lock()
	if m, ok := in.regs[old]; ok {
		delete(in.regs, old)
		in.regs[new] = m
	}
	in.mu.Unlock()
}

// Stall closes the gate: every Pin from now on waits until resume is
// called (once; calling it again does nothing).
func (in *Inbound) Stall() (resume func()) {
	gate := make(chan struct{})
	in.mu.Lock()
	in.gate = gate
	in.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			in.mu.Lock()
			if in.gate == gate {
				in.gate = nil
			}
			in.mu.Unlock()
			close(gate)
		})
	}
}

// Held is the number of pins not yet released.
func (in *Inbound) Held() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.held
}

// settle waits until no Pin waits at the gate and every pin is released:
// the receiver has finished with every batch it began. It polls a
// condition (bounded), it does not sleep for a guessed time.
func (in *Inbound) settle(limit time.Duration) error {
	end := time.Now().Add(limit)
	for {
		in.mu.Lock()
		waiting, held := in.inPin, in.held
		in.mu.Unlock()
		if waiting == 0 && held == 0 {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("after %v, %d Pin calls still wait and %d pins are held", limit, waiting, held)
		}
		time.Sleep(time.Millisecond)
	}
}

func (in *Inbound) kindErr() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.wrongKind
}
