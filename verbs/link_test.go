package verbs

import "testing"

func TestLinkBitsPerSecond(t *testing.T) {
	for _, c := range []struct {
		speed, width uint8
		want         uint64
	}{
		{1, 1, 2_500_000_000},     // rxe over a netdev without a speed: 1X SDR
		{32, 2, 100_000_000_000},  // 4X EDR
		{64, 2, 200_000_000_000},  // 4X HDR
		{128, 2, 400_000_000_000}, // 4X NDR
		{64, 16, 100_000_000_000}, // 2X HDR
		{0, 2, 0},                 // unknown speed
		{32, 0, 0},                // unknown width
	} {
		if got := (PortAttr{ActiveSpeed: c.speed, ActiveWidth: c.width}).LinkBitsPerSecond(); got != c.want {
			t.Errorf("speed %d width %d: %d b/s, want %d", c.speed, c.width, got, c.want)
		}
	}
}
