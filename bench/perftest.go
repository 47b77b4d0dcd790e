package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
)

// LoadPerftest reads the RDMA test script's ib_write_bw results: a JSON
// object mapping block size in bytes (string keys) to GB/s.
func LoadPerftest(path string) (map[uint64]float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--perftest: %w", err)
	}
	m, err := ParsePerftest(b)
	if err != nil {
		return nil, fmt.Errorf("--perftest %s: %w", path, err)
	}
	return m, nil
}

// ParsePerftest decodes {"4096": 12.5, ...}.
func ParsePerftest(b []byte) (map[uint64]float64, error) {
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
