package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// cutTrials: B pushes a 16 MiB batch to A with a deadline (half the time
// of a whole push just before) that falls while it is on the wire, once with both daemons running ("plain") and once
// with A's daemon stopped by SIGSTOP once the first bytes landed
// ("frozen": A's kernel still takes the WRITEs, but the daemon answers
// nothing). Each answer must be DeadlineExceeded (or success with every
// block in place) within the deadline + 100 ms + this VM's measured delays
// (answerMargin, watchStalls), and the destination, mapped here, must not
// change after the answer: a frozen A gets SIGCONT a second after the
// answer, and the destination is watched through that second and the 2 s
// after. A late answer is tried again, up to 3 times in all (a VM on a
// loaded host stalls now and then): every lateness is logged, and only a
// case late on every attempt fails. The next batch must land whole.
func (r *remoteRig) cutTrials(trials int) *faultRow {
	t := r.t
	row := newRow("deadline mid-batch (16 MiB), receiver running, then SIGSTOPped", r.kind)
	for trial := 1; trial <= trials; trial++ {
		for _, frozen := range []bool{false, true} {
			name := fmt.Sprintf("cut trial %d (plain)", trial)
			if frozen {
				name = fmt.Sprintf("cut trial %d (frozen receiver)", trial)
			}
			for attempt := 1; ; attempt++ {
				past, late, err := r.cutOnce(name, 700+10*trial+attempt, frozen)
				if late == "" {
					row.add(outcome(err), past, true)
					break
				}
				if attempt == 3 {
					t.Errorf("%s: late on all %d attempts; the last %s", name, attempt, late)
					row.add(outcome(err)+"-late", past, true)
					break
				}
				t.Logf("%s attempt %d: %s; trying again", name, attempt, late)
			}
		}
	}
	return row
}

// cutOnce runs one cut: how long after the deadline it answered, why it
// was late ("" when it was not), and the batch's error.
func (r *remoteRig) cutOnce(name string, pattern int, frozen bool) (time.Duration, string, error) {
	t := r.t
	r.prepare(pattern)
	w0 := time.Now()
	r.warmBackTries(name + " warm-up")
	// Half a whole push (about a second over the emulated wire) falls
	// mid-batch, also with the receiver stopped: its kernel places the
	// WRITEs at the same pace.
	deadline := max(200*time.Millisecond, time.Since(w0)/2)
	clear(r.dst.Bytes)
	margin := answerMargin(context.Background(), t, r.rc)
	stalls := watchStalls()
	peerStalls := watchPeerAPI(r.rc)
	start := time.Now()
	done := r.asyncBack(deadline)
	var stopped time.Time
	if frozen {
		if !r.waitFirstBytes(done, deadline) {
			t.Logf("%s: the batch ended before its first bytes were seen", name)
		}
		if err := stopProc(r.local); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		stopped = time.Now()
	}
	cont := func() {
		if frozen {
			if err := r.local.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatalf("%s: SIGCONT A's daemon: %v", name, err)
			}
			frozen = false
		}
	}
	defer cont()
	end := <-done
	took := end.at.Sub(start)
	snap := bytes.Clone(r.dst.Bytes)
	peerStall := peerStalls()
	margin += stalls() + peerStall
	err := end.err
	switch {
	case err == nil:
		if lerr := r.landed(r.seed.Bytes, r.dst.Bytes); lerr != nil {
			t.Fatalf("%s: success but %v", name, lerr)
		}
	case status.Code(err) != codes.DeadlineExceeded:
		t.Fatalf("%s: %v, want DeadlineExceeded", name, err)
	}
	whole := 0
	for i := range r.offs {
		s, d := r.seed.Bytes[r.offs[i]:r.offs[i]+r.size], snap[r.dstOffs[i]:r.dstOffs[i]+r.size]
		if bytes.Equal(s, d) {
			whole++
		}
	}
	// While A is stopped, then in the 2 s after SIGCONT: the destination
	// must not change (what had landed by the answer is all that lands).
	var during string
	if !stopped.IsZero() {
		if first, last, changed := watchChanges(snap, r.dst.Bytes, time.Second); changed > 0 {
			during = fmt.Sprintf("%d bytes changed while A was stopped, the first %v and the last %v after the answer", changed, first, last)
		}
		cont()
	}
	if first, last, changed := watchChanges(snap, r.dst.Bytes, 2*time.Second); changed > 0 || during != "" {
		// As TestFrozenPeer: only an answer that says the copy the stopped
		// receiver was in may still complete allows bytes after SIGCONT
		// (none while it is stopped): at most one block per stream, and
		// only the source's own bytes.
		if during != "" || err == nil || !strings.Contains(err.Error(), "may still complete") || changed > tcpStreams*int(r.size) {
			t.Fatalf("%s (answered %v after the call: %v): destination changed after the answer: %s; %d bytes in the 2 s after SIGCONT (first %v, last %v after it)",
				name, took.Round(time.Millisecond), err, during, changed, first, last)
		}
		want := bytes.Clone(snap)
		for i := range r.offs {
			copy(want[r.dstOffs[i]:r.dstOffs[i]+r.size], r.seed.Bytes[r.offs[i]:r.offs[i]+r.size])
		}
		if _, wrong := lateBytes(snap, r.dst.Bytes, want); wrong > 0 {
			t.Fatalf("%s: %d bytes landed after the unconfirmed answer, %d of them not the source's", name, changed, wrong)
		}
		t.Logf("%s: %d bytes of a frame in placement landed after the unconfirmed answer, as it allows: %v", name, changed, err)
	}
	past := took - deadline
	late := ""
	if limit := deadline + pullStopBudget + margin; err != nil && took > limit {
		late = fmt.Sprintf("answered %v after the call (%v past the deadline), past the deadline + %v + %v (this VM's scheduling and API delay): %v",
			took.Round(time.Millisecond), past.Round(time.Millisecond), pullStopBudget, margin.Round(time.Millisecond), err)
	}
	frz := ""
	if !stopped.IsZero() {
		frz = fmt.Sprintf(" (A stopped %v after the call)", stopped.Sub(start).Round(time.Millisecond))
	}
	t.Logf("%s%s: deadline %v: %v %v after the call (%v past the deadline; margin %v, of which B's API stalled %v during the call), %d of %d blocks whole at the answer, 0 bytes changed after it: %v",
		name, frz, deadline.Round(time.Millisecond), outcome(err), took.Round(time.Millisecond), past.Round(time.Millisecond), margin.Round(time.Millisecond), peerStall.Round(time.Millisecond), whole, len(r.offs), err)
	r.warmBackTries(name + ": the next batch")
	return max(0, past), late, err
}

// watchPeerAPI pings the sending daemon's API (B's) back to back, 10 ms
// apart, until the returned func is called, which gives the worst round
// trip. B is the VM whose single vCPU runs rxe's sending inside the
// kernel: while that monopolises it, B's daemon answers nothing, its cut
// included, and this is how long it could not; a daemon that merely waits
// too long (the fault this test catches) leaves its API answering at once.
func watchPeerAPI(c *client.Client) func() time.Duration {
	done, res := make(chan struct{}), make(chan time.Duration, 1)
	go func() {
		var worst time.Duration
		for {
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, _ = c.API().Ping(ctx, &b2bv1.PingRequest{})
			cancel()
			worst = max(worst, time.Since(t0))
			select {
			case <-done:
				res <- worst
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return func() time.Duration { close(done); return <-res }
}

// warmBackTries is warmBack, tried up to 3 times: after a receiver was
// stopped (or killed), a batch over rxe now and then fails at the NIC with
// "remote invalid request" on fresh connections too (seen in the kill
// trials as well); that is not what the cut trials test. Each failure is
// logged.
func (r *remoteRig) warmBackTries(what string) {
	for try := 1; ; try++ {
		clear(r.dst.Bytes)
		_, err := r.back(context.Background(), 60*time.Second)
		if err == nil {
			err = r.landed(r.seed.Bytes, r.dst.Bytes)
		}
		if err == nil {
			return
		}
		if try == 3 {
			r.t.Fatalf("%s: %v (try %d)", what, err, try)
		}
		r.t.Logf("%s: %v (try %d; trying again)", what, err, try)
	}
}
