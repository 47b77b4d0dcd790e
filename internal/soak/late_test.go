package soak

import (
	"hash/crc32"
	"os"
	"strings"
	"testing"
)

// TestChangedBytes: a quarantined transfer's changed bytes are counted by
// block, against each block's CRC at the answer.
func TestChangedBytes(t *testing.T) {
	mem := make([]byte, 8<<10)
	q := quarantined{mem: mem, offs: []uint64{0, 2048, 6144}, n: 2048}
	for _, o := range q.offs {
		q.blockCRCs = append(q.blockCRCs, crc32.Checksum(mem[o:o+q.n], castagnoli))
	}
	if n := q.changedBytes(); n != 0 {
		t.Fatalf("nothing changed: %d B", n)
	}
	mem[2048+5], mem[6144] = 1, 1
	if n := q.changedBytes(); n != 4096 {
		t.Fatalf("two blocks changed: %d B, want 4096", n)
	}
}

// TestUnconfirmedCutMatchesTCP: the soak's exception for late bytes is
// what the tcp transport's answer says (its text and its copy's bound):
// if tcp changes either, this fails and the exception must follow.
func TestUnconfirmedCutMatchesTCP(t *testing.T) {
	conn, err := os.ReadFile("../transport/tcp/conn.go")
	if err != nil {
		t.Fatal(err)
	}
	recv, err := os.ReadFile("../transport/tcp/recv.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(conn), unconfirmedCut) || !strings.Contains(string(conn), "the copy (16 KiB at most)") {
		t.Errorf("tcp's cut note no longer says %q and its 16 KiB bound", unconfirmedCut)
	}
	if cutWindow != 16<<10 || !strings.Contains(string(recv), "const copyPiece = 16 << 10") {
		t.Errorf("cutWindow %d is not tcp's copyPiece", cutWindow)
	}
}
