package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
)

// Perftest is an ib_write_bw run to compare with: its name (which run,
// e.g. "default" or "tuned (-q 4 --post_list 32)") and GB/s per block size.
type Perftest struct {
	Run  string
	GBps map[uint64]float64
}

// LoadPerftest reads the RDMA test script's ib_write_bw results: a JSON
// object mapping block size in bytes (string keys) to GB/s.
func LoadPerftest(path string) (Perftest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Perftest{}, fmt.Errorf("--perftest: %w", err)
	}
	p, err := ParsePerftest(b)
	if err != nil {
		return Perftest{}, fmt.Errorf("--perftest %s: %w", path, err)
	}
	if p.Run == "" {
		p.Run = path
	}
	return p, nil
}

// ParsePerftest decodes {"run": "tuned", "gbps": {"4096": 12.5, ...}}, or
// the bare {"4096": 12.5, ...} (the run then unnamed).
func ParsePerftest(b []byte) (Perftest, error) {
	var named struct {
		Run  *string        `json:"run"`
		GBps map[string]any `json:"gbps"`
	}
	if err := json.Unmarshal(b, &named); err == nil && named.Run != nil {
		if named.GBps == nil {
			return Perftest{}, fmt.Errorf(`"gbps": missing (want an object of block size to GB/s)`)
		}
		inner, _ := json.Marshal(named.GBps)
		m, err := parsePerftestRates(inner)
		return Perftest{Run: *named.Run, GBps: m}, err
	}
	m, err := parsePerftestRates(b)
	return Perftest{GBps: m}, err
}

func parsePerftestRates(b []byte) (map[uint64]float64, error) {
	var raw map[string]float64
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("want a JSON object of block size (bytes, as a string) to GB/s: %w", err)
	}
	out := make(map[uint64]float64, len(raw))
	for k, v := range raw {
		size, err := strconv.ParseUint(k, 10, 64)
		if err != nil || size == 0 {
			return nil, fmt.Errorf("key %q is not a block size in bytes", k)
		}
		if v <= 0 {
			return nil, fmt.Errorf("size %s: %v GB/s is not a positive rate", k, v)
		}
		out[size] = v
	}
	return out, nil
}
