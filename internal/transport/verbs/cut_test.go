package verbs

import (
	"context"
	"testing"
	"time"
)

// TestPostCut: a write still inside a post call past its deadline +
// postCutGrace is stopped from outside it (cutEarly, the QPs to ERROR);
// one that left the post call in time, or has no deadline, is not.
func TestPostCut(t *testing.T) {
	for _, tc := range []struct {
		name        string
		deadline    bool
		inPost      bool
		wantStopped bool
	}{
		{"inside a post call past the deadline", true, true, true},
		{"between post calls", true, false, false},
		{"no deadline", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := stallSet(time.Hour)
			s.postCut = time.AfterFunc(time.Hour, s.onPostCut)
			s.postCut.Stop()
			ctx := context.Background()
			if tc.deadline {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 10*time.Millisecond)
				defer cancel()
			}
			if armed := s.armPostCut(ctx); armed != tc.deadline {
				t.Fatalf("armPostCut = %v with a deadline %v", armed, tc.deadline)
			}
			defer s.postCut.Stop()
			if tc.inPost {
				s.enterPost()
			}
			// Past the deadline and the grace: a stop comes (a loaded host
			// runs the timer late, so it is waited for), or never does.
			time.Sleep(10*time.Millisecond + postCutGrace + 20*time.Millisecond)
			for end := time.Now().Add(5 * time.Second); tc.wantStopped && !s.cutEarly.Load() && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			if tc.inPost {
				s.leavePost()
			}
			if got := s.cutEarly.Load(); got != tc.wantStopped {
				t.Fatalf("stopped from outside the post call: %v, want %v", got, tc.wantStopped)
			}
			// Once out of the post call, a late timer does nothing.
			s.cutEarly.Store(false)
			s.onPostCut()
			if s.cutEarly.Load() {
				t.Fatal("the watch stopped a write that was not inside a post call")
			}
		})
	}
}
