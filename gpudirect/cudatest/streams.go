package cudatest

// The simulated driver's streams, events and copies.

import (
	"fmt"

	"github.com/b2bd/b2bd/gpudirect"
)

func (m *Driver) liveStream(s *gpudirect.Stream) bool { _, ok := m.streams[s]; return ok }
func (m *Driver) liveEvent(e *gpudirect.Event) bool   { _, ok := m.events[e]; return ok }

func (m *Driver) stream(s *gpudirect.Stream) error {
	switch {
	case s == nil:
		return fmt.Errorf("%w: gpudirect: nil stream", gpudirect.ErrInvalidValue)
	case s.Owner() != any(m):
		return fmt.Errorf("%w: gpudirect: stream was created by another gpudirect.Interface", gpudirect.ErrInvalidValue)
	case !m.liveStream(s):
		return gpudirect.ErrStreamDestroyed
	}
	return nil
}

func (m *Driver) event(e *gpudirect.Event) error {
	switch {
	case e == nil:
		return fmt.Errorf("%w: gpudirect: nil event", gpudirect.ErrInvalidValue)
	case e.Owner() != any(m):
		return fmt.Errorf("%w: gpudirect: event was created by another gpudirect.Interface", gpudirect.ErrInvalidValue)
	case !m.liveEvent(e):
		return gpudirect.ErrEventDestroyed
	}
	return nil
}

func (m *Driver) StreamCreate(dev int) (*gpudirect.Stream, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("StreamCreate"); err != nil {
		return nil, err
	}
	if err := m.checkDev(dev); err != nil {
		return nil, err
	}
	s := gpudirect.NewStream(m, dev)
	m.streams[s] = struct{}{}
	return s, nil
}

func (m *Driver) StreamSynchronize(s *gpudirect.Stream) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("StreamSynchronize"); err != nil {
		return err
	}
	return m.stream(s)
}

func (m *Driver) StreamDestroy(s *gpudirect.Stream) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("StreamDestroy"); err != nil {
		return err
	}
	if s != nil && s.Owner() == any(m) && !m.liveStream(s) {
		return nil
	}
	if err := m.stream(s); err != nil {
		return err
	}
	delete(m.streams, s)
	return nil
}

func (m *Driver) EventCreate(dev int) (*gpudirect.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("EventCreate"); err != nil {
		return nil, err
	}
	if err := m.checkDev(dev); err != nil {
		return nil, err
	}
	e := gpudirect.NewEvent(m, dev)
	m.events[e] = struct{}{}
	return e, nil
}

func (m *Driver) EventRecord(e *gpudirect.Event, s *gpudirect.Stream) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("EventRecord"); err != nil {
		return err
	}
	if err := m.event(e); err != nil {
		return err
	}
	if err := m.stream(s); err != nil {
		return err
	}
	if e.Device() != s.Device() {
		return fmt.Errorf("%w: gpudirect: cuEventRecord: event is on device %d, stream on device %d", gpudirect.ErrInvalidValue, e.Device(), s.Device())
	}
	return nil
}

func (m *Driver) EventQuery(e *gpudirect.Event) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("EventQuery"); err != nil {
		return false, err
	}
	if err := m.event(e); err != nil {
		return false, err
	}
	return true, nil
}

func (m *Driver) EventSynchronize(e *gpudirect.Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("EventSynchronize"); err != nil {
		return err
	}
	return m.event(e)
}

func (m *Driver) EventDestroy(e *gpudirect.Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("EventDestroy"); err != nil {
		return err
	}
	if e != nil && e.Owner() == any(m) && !m.liveEvent(e) {
		return nil
	}
	if err := m.event(e); err != nil {
		return err
	}
	delete(m.events, e)
	return nil
}

func (m *Driver) copy(dst, src, size uint64) error {
	d, err := m.bytesAt(dst, size)
	if err != nil {
		return fmt.Errorf("destination: %w", err)
	}
	s, err := m.bytesAt(src, size)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	copy(d, s)
	return nil
}

func (m *Driver) MemcpyHtoDAsync(s *gpudirect.Stream, dst, src uintptr, size uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("MemcpyHtoDAsync"); err != nil {
		return err
	}
	if err := m.stream(s); err != nil {
		return err
	}
	if size == 0 {
		return nil
	}
	if _, _, err := m.find(uint64(dst), size, true); err != nil {
		return mockErr(s.Device(), fmt.Sprintf("cuMemcpyHtoDAsync_v2(dst=%#x, src=%#x, size=%d)", dst, src, size), gpudirect.ErrorInvalidValue)
	}
	if err := m.copy(uint64(dst), uint64(src), size); err != nil {
		return fmt.Errorf("gpudirect: cuMemcpyHtoDAsync_v2 on device %d: %w", s.Device(), err)
	}
	return nil
}

func (m *Driver) MemcpyDtoHAsync(s *gpudirect.Stream, dst, src uintptr, size uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("MemcpyDtoHAsync"); err != nil {
		return err
	}
	if err := m.stream(s); err != nil {
		return err
	}
	if size == 0 {
		return nil
	}
	if _, _, err := m.find(uint64(src), size, true); err != nil {
		return mockErr(s.Device(), fmt.Sprintf("cuMemcpyDtoHAsync_v2(dst=%#x, src=%#x, size=%d)", dst, src, size), gpudirect.ErrorInvalidValue)
	}
	if err := m.copy(uint64(dst), uint64(src), size); err != nil {
		return fmt.Errorf("gpudirect: cuMemcpyDtoHAsync_v2 on device %d: %w", s.Device(), err)
	}
	return nil
}

func (m *Driver) MemcpyBatchAsync(s *gpudirect.Stream, dsts, srcs, sizes []uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter("MemcpyBatchAsync"); err != nil {
		return err
	}
	if err := m.stream(s); err != nil {
		return err
	}
	if err := gpudirect.CheckBatch(dsts, srcs, sizes); err != nil {
		return err
	}
	m.batches++
	m.copies += len(sizes)
	for i := range sizes {
		m.count(dsts[i], srcs[i], sizes[i])
		if err := m.copy(dsts[i], srcs[i], sizes[i]); err != nil {
			return fmt.Errorf("gpudirect: cuMemcpyBatchAsync_v2(count=%d) on device %d: copy %d: %w", len(sizes), s.Device(), i, err)
		}
	}
	return nil
}

// MemcpyBatchAsyncParts splits the batch as the real driver does and runs
// the parts one after the other (each counted as a batch call).
func (m *Driver) MemcpyBatchAsyncParts(ss []*gpudirect.Stream, dsts, srcs, sizes []uint64) error {
	m.mu.Lock()
	err := m.enter("MemcpyBatchAsyncParts")
	m.mu.Unlock()
	if err != nil {
		return err
	}
	if len(ss) == 0 {
		return fmt.Errorf("%w: gpudirect: batch copy in parts on no stream", gpudirect.ErrInvalidValue)
	}
	if err := gpudirect.CheckBatch(dsts, srcs, sizes); err != nil {
		return err
	}
	k := max(1, min(len(ss), len(sizes), gpudirect.ParallelParts))
	for j := 1; j < k; j++ {
		if ss[j].Device() != ss[0].Device() {
			return fmt.Errorf("%w: gpudirect: batch copy in parts on streams of devices %d and %d", gpudirect.ErrInvalidValue, ss[0].Device(), ss[j].Device())
		}
	}
	n := len(sizes)
	for j := 0; j < k; j++ {
		lo, hi := n*j/k, n*(j+1)/k
		if lo == hi {
			continue
		}
		if err := m.MemcpyBatchAsync(ss[j], dsts[lo:hi], srcs[lo:hi], sizes[lo:hi]); err != nil {
			return fmt.Errorf("part %d of %d: %w", j+1, k, err)
		}
	}
	return nil
}
