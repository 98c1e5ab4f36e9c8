package limits

import (
	"testing"
	"time"
)

func TestPolicyWindow(t *testing.T) {
	tests := []struct {
		limit  int64
		period time.Duration
		q, w   int64
		scaled bool
	}{
		{5, time.Minute, 5, 60, false},
		{10, 24 * time.Hour, 10, 86400, false},
		{1, time.Second, 1, 1, false},
		{10, 500 * time.Millisecond, 20, 1, true},    // 2 periods make 1 s
		{7, 1500 * time.Millisecond, 14, 3, true},    // 2 periods make 3 s
		{3, 2500 * time.Millisecond, 6, 5, true},     // 2 periods make 5 s
		{1, 250 * time.Millisecond, 4, 1, true},      // 4 periods
		{1, 999 * time.Millisecond, 1000, 999, true}, // 1000 periods: the only whole-second multiple
		{1, time.Millisecond, 1000, 1, true},
		{1_000_000_000, 400*24*time.Hour + time.Millisecond, 1_000_000_000_000, 34_560_000_001, true},
	}
	for _, tt := range tests {
		q, w, scaled := PolicyWindow(tt.limit, tt.period)
		if q != tt.q || w != tt.w || scaled != tt.scaled {
			t.Errorf("PolicyWindow(%d, %v) = q=%d w=%d scaled=%v, want q=%d w=%d scaled=%v",
				tt.limit, tt.period, q, w, scaled, tt.q, tt.w, tt.scaled)
		}
		// Never a misstatement: q/w is exactly limit/period.
		if q*int64(tt.period/time.Millisecond) != tt.limit*w*1000 {
			t.Errorf("PolicyWindow(%d, %v): q=%d per w=%ds is not the rule's rate", tt.limit, tt.period, q, w)
		}
	}
}

// TestPolicyHeaderSubSecond: 10 per 500ms is 20 per second, never "q=10;w=1".
