package storetest

import (
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

func TestSteadyPeriodLeavesHalfAnHour(t *testing.T) {
	p := SteadyPeriod()
	if p < limits.PeriodUS(time.Hour) || p > limits.PeriodUS(2*time.Hour) {
		t.Fatalf("SteadyPeriod %d µs, want an hour or a little more", p)
	}
	now := time.Now().UnixMicro()
	if left := time.Duration(p-now%p) * time.Microsecond; left < 29*time.Minute {
		t.Fatalf("the window of %d µs ends in %v, want at least half an hour", p, left)
	}
	if SteadyPeriod() != p {
		t.Fatal("SteadyPeriod changed within the process")
	}
}
