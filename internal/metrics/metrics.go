// Package metrics exposes b2bd's state to Prometheus.
//
// The data path pays nothing for it: everything that already exists as a
// counter, a registry or a transport's handle count (received batches,
// regions, QPs, MRs) is read by Collectors at scrape time, and what is
// measured per batch (outcome, bytes, blocks, duration, errors by gRPC code,
// batches in flight) is measured by a unary interceptor on the local API
// server, once per call, on the control path.
//
// Names follow Prometheus' rules: the b2bd_ prefix, base units (seconds,
// bytes), _total on counters, and labels with a bounded set of values
// (transport: tcp, verbs, local, auto; outcome: ok, error; code: the 17 gRPC codes;
// size_class: 4 classes; kind: host, cuda; method: the registered methods).
package metrics

import (
	"context"
	"encoding/binary"
	"net/http"
	"runtime"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

const namespace = "b2bd"

// Outcome label values.
const (
	OutcomeOK    = "ok"
	OutcomeError = "error"
)

// Size classes, by a batch's mean block size.
const (
	SizeLE4KiB  = "le_4KiB"
	SizeLE64KiB = "le_64KiB"
	SizeLE1MiB  = "le_1MiB"
	SizeGT1MiB  = "gt_1MiB"
)

// SizeClass buckets a batch by its mean block size (0 blocks: the smallest).
func SizeClass(blocks, bytes uint64) string {
	var mean uint64
	if blocks > 0 {
		mean = bytes / blocks
	}
	switch {
	case mean <= 4<<10:
		return SizeLE4KiB
	case mean <= 64<<10:
		return SizeLE64KiB
	case mean <= 1<<20:
		return SizeLE1MiB
	default:
		return SizeGT1MiB
	}
}

// TransportLabel is the transport label of a proto transport kind: the
// kind's own name in lower case (tcp, verbs, local, ...), derived from the
// enum so that a kind added to the API is never counted as another.
// Unspecified (a failed batch that let the daemon choose) and values
// outside the enum are "auto"; the label's values stay a fixed set.
func TransportLabel(k b2bv1.TransportKind) string {
	if l, ok := transportLabels[k]; ok {
		return l
	}
	return "auto"
}

var transportLabels = func() map[b2bv1.TransportKind]string {
	m := map[b2bv1.TransportKind]string{}
	for v, name := range b2bv1.TransportKind_name {
		if k := b2bv1.TransportKind(v); k != b2bv1.TransportKind_TRANSPORT_KIND_UNSPECIFIED {
			m[k] = strings.ToLower(strings.TrimPrefix(name, "TRANSPORT_KIND_"))
		}
	}
	return m
}()

// Phase is one timed phase of a batch.
type Phase struct {
	Name    string // from a fixed set (the proto's phase names)
	Seconds float64
}

// PhaseObserver extracts a successful batch's phase durations from its
// response; nil, or an empty result, observes none. The phase names must
// come from a fixed set: they become label values.
type PhaseObserver func(*b2bv1.BatchTransferResponse) []Phase

// ProtoPhases is the PhaseObserver of the response's own phases message.
func ProtoPhases(resp *b2bv1.BatchTransferResponse) []Phase {
	p := resp.GetPhases()
	if p == nil {
		return nil
	}
	return []Phase{
		{"decode", float64(p.GetDecodeNs()) / 1e9}, {"validate", float64(p.GetValidateNs()) / 1e9},
		{"resolve", float64(p.GetResolveNs()) / 1e9}, {"plan", float64(p.GetPlanNs()) / 1e9},
		{"post", float64(p.GetPostNs()) / 1e9}, {"wire", float64(p.GetWireNs()) / 1e9},
		{"notify", float64(p.GetNotifyNs()) / 1e9}, {"total", float64(p.GetTotalNs()) / 1e9},
	}
}

// RegionStats is the registered memory of one kind ("host" or "cuda").
type RegionStats struct {
	Kind    string
	Regions int
	Bytes   uint64
}

// TransportStats is one running transport's handles.
type TransportStats struct {
	Kind          string // "tcp" or "verbs"
	Connections   int
	QueuePairs    int
	MemoryRegions int
	RailsUp       int
}

// Sources are the daemon's state, read at scrape time; a nil func reports
// nothing.
type Sources struct {
	Version string
	// Received is the receiving side's batch and byte counts.
	Received func() (batches, bytes uint64)
	// Regions reports registered memory by kind.
	Regions func() []RegionStats
	// Transports reports the running transports' handles.
	Transports func() []TransportStats
	// Phases reads phase durations from BatchTransfer responses.
	Phases PhaseObserver
}

// Metrics is the daemon's Prometheus registry and its interceptor.
type Metrics struct {
	reg *prometheus.Registry
	src Sources

	batches    *prometheus.CounterVec
	blocks     *prometheus.CounterVec
	bytes      *prometheus.CounterVec
	errors     *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	phases     *prometheus.HistogramVec
	inFlight   prometheus.Gauge
	requests   *prometheus.CounterVec
	reqLatency *prometheus.HistogramVec
}

// durationBuckets span 50 µs to ~100 s.
var durationBuckets = prometheus.ExponentialBuckets(50e-6, 2.5, 17)

// New builds the registry: the per-call metrics, the scrape-time
// collectors over src, the Go and process collectors, and build_info.
func New(src Sources) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), src: src}
	m.batches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "batches_total",
		Help: "BatchTransfer calls answered by this daemon as the sender, by transport and outcome (ok, error).",
	}, []string{"transport", "outcome"})
	m.blocks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "batch_blocks_total",
		Help: "Blocks in BatchTransfer calls (as requested, before merging), by transport and outcome.",
	}, []string{"transport", "outcome"})
	m.bytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "batch_bytes_total",
		Help: "Bytes in BatchTransfer calls, by transport and outcome (error: the bytes the failed batch asked for).",
	}, []string{"transport", "outcome"})
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "batch_errors_total",
		Help: "Failed BatchTransfer calls by transport and gRPC code.",
	}, []string{"transport", "code"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "batch_duration_seconds",
		Help:    "BatchTransfer call duration, as the daemon saw it, by transport, outcome and size class (mean block size).",
		Buckets: durationBuckets,
	}, []string{"transport", "outcome", "size_class"})
	m.phases = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "batch_phase_duration_seconds",
		Help:    "Duration of each phase of successful batches, by transport and phase.",
		Buckets: durationBuckets,
	}, []string{"transport", "phase"})
	m.inFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "batches_in_flight",
		Help: "BatchTransfer calls in progress on this daemon.",
	})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "api_requests_total",
		Help: "Local API calls by method and gRPC code (OK included).",
	}, []string{"method", "code"})
	m.reqLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "api_request_duration_seconds",
		Help:    "Local API call duration by method.",
		Buckets: durationBuckets,
	}, []string{"method"})
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help: "Always 1; the labels say which b2bd this is.",
	}, []string{"version", "goversion"})
	build.WithLabelValues(src.Version, runtime.Version()).Set(1)
	m.reg.MustRegister(m.batches, m.blocks, m.bytes, m.errors, m.duration, m.phases, m.inFlight,
		m.requests, m.reqLatency, build, &stateCollector{src: src},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is the Prometheus registry (for tests and extra collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// methodName is the last element of a full gRPC method name.
func methodName(full string) string {
	if i := strings.LastIndexByte(full, '/'); i >= 0 {
		return full[i+1:]
	}
	return full
}

// UnaryInterceptor measures every local API call, and the transfers it
// runs to their end (BatchTransfer, TransferBlocks, SubmitTransfer) in
// detail. It adds no work to the data path: it runs once per call.
func (m *Metrics) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		// A prepared submit is a batch too; its request names a plan, so a
		// failed one counts no blocks or bytes.
		breq, isBatch := req.(*b2bv1.BatchTransferRequest)
		switch req.(type) {
		case *b2bv1.SubmitTransferRequest, *b2bv1.TransferBlocksRequest: // a failed one counts no blocks or bytes
			isBatch = true
		}
		if isBatch {
			m.inFlight.Inc()
		}
		start := time.Now()
		resp, err := handler(ctx, req)
		elapsed := time.Since(start).Seconds()
		if isBatch {
			m.inFlight.Dec()
			bresp, _ := resp.(*b2bv1.BatchTransferResponse)
			m.observeBatch(breq, bresp, err, elapsed)
		}
		method := methodName(info.FullMethod)
		m.requests.WithLabelValues(method, status.Code(err).String()).Inc()
		m.reqLatency.WithLabelValues(method).Observe(elapsed)
		return resp, err
	}
}

// ObserveSubmit counts a transfer that no unary interceptor saw (a submit
// on a SubmitStream or the raw submit socket, a ring record's transfer, one
// started by StartTransfer(s) as it ends) as the interceptor counts a
// SubmitTransfer call: resp is nil when err is not.
func (m *Metrics) ObserveSubmit(resp *b2bv1.BatchTransferResponse, err error, seconds float64) {
	m.observeBatch(nil, resp, err, seconds)
}

func (m *Metrics) observeBatch(req *b2bv1.BatchTransferRequest, resp *b2bv1.BatchTransferResponse, err error, seconds float64) {
	if err == nil && resp != nil {
		tr := TransportLabel(resp.GetTransport())
		blocks, bytes := resp.GetBlocks(), resp.GetBytes()
		m.batches.WithLabelValues(tr, OutcomeOK).Inc()
		m.blocks.WithLabelValues(tr, OutcomeOK).Add(float64(blocks))
		m.bytes.WithLabelValues(tr, OutcomeOK).Add(float64(bytes))
		m.duration.WithLabelValues(tr, OutcomeOK, SizeClass(blocks, bytes)).Observe(seconds)
		if m.src.Phases != nil {
			for _, p := range m.src.Phases(resp) {
				m.phases.WithLabelValues(tr, p.Name).Observe(p.Seconds)
			}
		}
		return
	}
	tr := TransportLabel(req.GetTransport())
	blocks, bytes := requested(req.GetDescriptors())
	m.batches.WithLabelValues(tr, OutcomeError).Inc()
	m.blocks.WithLabelValues(tr, OutcomeError).Add(float64(blocks))
	m.bytes.WithLabelValues(tr, OutcomeError).Add(float64(bytes))
	m.errors.WithLabelValues(tr, status.Code(err).String()).Inc()
	m.duration.WithLabelValues(tr, OutcomeError, SizeClass(blocks, bytes)).Observe(seconds)
}

// requested is what a batch's descriptors ask for: blocks (the source
// offsets) and bytes (block_length × blocks, or the sum of lengths). Bad
// descriptors (the batch failed validation) count what can be read.
func requested(d *b2bv1.Descriptors) (blocks, bytes uint64) {
	blocks = uint64(len(d.GetSrcOffsets()) / 8)
	if bl := d.GetBlockLength(); bl > 0 {
		return blocks, bl * blocks
	}
	lens := d.GetLengths()
	for i := 0; i+8 <= len(lens); i += 8 {
		bytes += binary.LittleEndian.Uint64(lens[i:])
	}
	return blocks, bytes
}

// stateCollector reads the daemon's state at scrape time.
type stateCollector struct{ src Sources }

var (
	descReceivedBatches = prometheus.NewDesc(namespace+"_received_batches_total",
		"Batches that landed in this daemon's regions (as the receiver).", nil, nil)
	descReceivedBytes = prometheus.NewDesc(namespace+"_received_bytes_total",
		"Bytes of batches that landed in this daemon's regions (as the receiver).", nil, nil)
	descRegions = prometheus.NewDesc(namespace+"_regions",
		"Registered regions by memory kind.", []string{"kind"}, nil)
	descRegionBytes = prometheus.NewDesc(namespace+"_region_bytes",
		"Registered memory in bytes by memory kind.", []string{"kind"}, nil)
	descConnections = prometheus.NewDesc(namespace+"_transport_connections",
		"Live data connections by transport (TCP: accepted streams; verbs: QP sets, both directions).", []string{"transport"}, nil)
	descQPs = prometheus.NewDesc(namespace+"_verbs_queue_pairs",
		"RDMA queue pairs in use.", nil, nil)
	descMRs = prometheus.NewDesc(namespace+"_verbs_memory_regions",
		"RDMA memory regions registered (the transport's own included).", nil, nil)
	descRails = prometheus.NewDesc(namespace+"_rdma_rails_up",
		"RDMA rails (NIC ports) the verbs transport is using.", nil, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReceivedBatches, descReceivedBytes, descRegions, descRegionBytes, descConnections, descQPs, descMRs, descRails} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	if f := c.src.Received; f != nil {
		batches, bytes := f()
		ch <- constMetric(descReceivedBatches, prometheus.CounterValue, float64(batches))
		ch <- constMetric(descReceivedBytes, prometheus.CounterValue, float64(bytes))
	}
	if f := c.src.Regions; f != nil {
		// host and cuda always appear, so a series does not vanish at 0.
		byKind := map[string]RegionStats{"host": {Kind: "host"}, "cuda": {Kind: "cuda"}}
		for _, r := range f() {
			s := byKind[r.Kind]
			s.Kind, s.Regions, s.Bytes = r.Kind, s.Regions+r.Regions, s.Bytes+r.Bytes
			byKind[r.Kind] = s
		}
		for _, s := range byKind {
			ch <- constMetric(descRegions, prometheus.GaugeValue, float64(s.Regions), s.Kind)
			ch <- constMetric(descRegionBytes, prometheus.GaugeValue, float64(s.Bytes), s.Kind)
		}
	}
	if f := c.src.Transports; f != nil {
		var qps, mrs, rails int
		for _, t := range f() {
			ch <- constMetric(descConnections, prometheus.GaugeValue, float64(t.Connections), t.Kind)
			qps += t.QueuePairs
			mrs += t.MemoryRegions
			rails += t.RailsUp
		}
		ch <- constMetric(descQPs, prometheus.GaugeValue, float64(qps))
		ch <- constMetric(descMRs, prometheus.GaugeValue, float64(mrs))
		ch <- constMetric(descRails, prometheus.GaugeValue, float64(rails))
	}
}

// constMetric is prometheus.MustNewConstMetric without the panic: a bad
// metric is reported by the scrape instead.
func constMetric(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) prometheus.Metric {
	m, err := prometheus.NewConstMetric(d, t, v, labels...)
	if err != nil {
		return prometheus.NewInvalidMetric(d, err)
	}
	return m
}
